"""The README's quickstart is the tested docs/quickstart.py, word for word."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_quickstart_is_docs_quickstart():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert blocks == [(ROOT / "docs" / "quickstart.py").read_text()]


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text().splitlines()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    test_commands = [line for line in readme if line.startswith("python3") and "pytest" in line]
    assert len(test_commands) == 1 and test_commands[0] in ci
