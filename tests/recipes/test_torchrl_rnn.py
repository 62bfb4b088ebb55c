"""--rnn torchrl: the ppo and dqn recipes on TorchRL's GRUModule / LSTMModule inside ResetRNN give,
with the same weights, the same run as on ResetRNN over nn.GRU / nn.LSTM, figure for figure."""
import pytest

from torchrl_seqchunk import ResetRNN
from torchrl_seqchunk.recipes import dqn, ppo
from torchrl_seqchunk.recipes.common.agent import recurrent_layer
from torchrl.modules import GRUModule, LSTMModule


def figures(run):
    """Every figure but the times; NaN (no episode or no gradient step yet) as None, to compare."""
    return [{k: None if v != v else v for k, v in row.items() if k not in ("wall_s", "learn_s")} for row in run.rows]


@pytest.mark.parametrize("options", [dict(cell="gru"), dict(cell="lstm"), dict(batching="streams"),
                                     dict(boundary_mode="mask")])
def test_ppo_on_torchrl_modules_is_the_same_run(tmp_path, options):
    runs = [ppo.train(ppo.Config(total_frames=768, runs_dir=str(tmp_path / rnn), progress=False, rnn=rnn, **options))
            for rnn in ("resetrnn", "torchrl")]
    assert len(runs[0].rows) == 3 and figures(runs[0]) == figures(runs[1])


def test_dqn_on_torchrl_modules_is_the_same_run(tmp_path):
    runs = [dqn.train(dqn.Config(total_frames=2048, runs_dir=str(tmp_path / rnn), progress=False, rnn=rnn))
            for rnn in ("resetrnn", "torchrl")]
    assert any(row["grad_steps"] for row in runs[0].rows)  # the loss ran
    assert figures(runs[0]) == figures(runs[1])


def test_the_torchrl_layer_is_torchrls_module_with_its_keys():
    gru = recurrent_layer("torchrl", "gru", 4, 8, in_key="x", out_key="y", state_key="s")
    lstm = recurrent_layer("torchrl", "lstm", 4, 8, in_key="x", out_key="y", state_key="s")
    assert isinstance(gru, ResetRNN) and isinstance(gru.rnn, GRUModule) and gru.state_keys == ["s"]
    assert isinstance(lstm.rnn, LSTMModule) and lstm.state_keys == lstm.reset_state_keys == ["s_h", "s_c"]
