"""The README's code is tested code, word for word; its commands are what CI and the package run."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def test_readme_code_is_the_tested_quickstart_and_recipe():
    """The quickstart (tests/test_docs.py runs it) and the recipe lines of docs/examples.md (run there)."""
    quickstart = (ROOT / "docs" / "quickstart.py").read_text()
    assert python_blocks(ROOT / "README.md") == [quickstart, python_blocks(ROOT / "docs" / "examples.md")[0]]


def test_readme_is_short_and_its_main_job_is_the_installed_command():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    main_job = [line for line in readme.splitlines() if line.startswith("python3") and "pytest" not in line]
    assert len(main_job) == 1 and main_job[0].endswith("&& seqchunk ppo")
    assert 'seqchunk = "torchrl_seqchunk.recipes.cli:main"' in (ROOT / "pyproject.toml").read_text()


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text().splitlines()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    test_commands = [line for line in readme if line.startswith("python3") and "pytest" in line]
    assert len(test_commands) == 1 and test_commands[0] in ci
