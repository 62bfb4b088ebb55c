"""The recipes from Python and the seqchunk command's own answers: a few lines train on any
gymnasium id and return the run; every recipe's docstring examples run."""
import doctest
import importlib
import math
from pathlib import Path

import pytest

from refusals import refused  # tests/refusals.py

from torchrl_seqchunk.recipes import cli
from torchrl_seqchunk.recipes.common.report import Run

ROOT = Path(__file__).resolve().parents[2]


def test_a_few_lines_train_recurrent_ppo_on_any_gymnasium_id(tmp_path):
    from torchrl_seqchunk.recipes import ppo

    run = ppo.train(ppo.Config(env="Pendulum-v1", keep="0,1", total_frames=256, num_envs=2, runs_dir=str(tmp_path),
                               progress=False))
    assert run.out_dir == tmp_path / "Pendulum-v1_keep0,1_reset_continue_seed0"
    assert ppo.Config(env="Pendulum-v1", keep="0, 1").name == run.out_dir.name  # the indices, as parsed
    long = ppo.Config(env="Taxi-v3", keep=",".join(map(str, range(100)))).name  # a count and a digest
    assert long.startswith("Taxi-v3_keep100of") and len(long) < 64 and ppo.Config().name == "CartPole-v1_reset_continue_seed0"
    assert [r["frames"] for r in run.rows] == [64, 128, 192, 256]  # 2 envs x 32 steps per iteration
    assert run.files == (run.metrics, run.out_dir / "learning_curve.png") and all(p.exists() for p in run.files)
    assert all(math.isfinite(r["loss_critic"]) for r in run.rows)
    read = Run.read(run.out_dir)  # the rows are metrics.csv's, read back as the report wrote them
    assert read.files == run.files and [r["frames"] for r in read.rows] == [r["frames"] for r in run.rows]
    assert [r["loss_critic"] for r in read.rows] == [r["loss_critic"] for r in run.rows]


@pytest.mark.parametrize("name", sorted(cli.RECIPES))
def test_every_recipe_has_a_config_a_command_check_and_a_trainer_whose_examples_run(name):
    module = cli.recipe(name)
    assert callable(module.train) and callable(module.check_command) and hasattr(module, "Config")
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def test_the_command_lists_its_recipes_and_refuses_an_unknown_one(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.parse(["--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0 and all(f"{name} " in out for name in cli.RECIPES)
    assert "td3" not in out  # what is listed is what there is
    unknown = " ".join(refused(lambda: cli.parse(["no-such-recipe"])).split())
    assert "Unrecognized options: no-such-recipe" in unknown and "world-model, distributed-ppo" in unknown
    assert "Missing subcommand" in refused(lambda: cli.parse([]))


def test_the_console_script_is_the_command():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    module, _, function = project["scripts"]["seqchunk"].partition(":")
    assert getattr(importlib.import_module(module), function) is cli.main
    assert any(d.startswith("tyro") for d in project["dependencies"])  # the command needs it installed


def test_the_curriculum_recipes_demos_ship_with_the_package():
    from torchrl_seqchunk.recipes import curriculum

    tomllib = pytest.importorskip("tomllib")  # Python 3.11
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "data/*.npz" in setuptools["package-data"]["torchrl_seqchunk.recipes"]
    for demo, _, _ in curriculum.TASKS.values():
        assert demo.exists() and demo.parent == Path(curriculum.__file__).parent / "data"
