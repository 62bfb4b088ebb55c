"""Trainers installed with the package, one job per module, each a ``Config`` dataclass and a
``train(cfg)`` that trains and returns its ``Run`` (``out_dir``, metrics.csv's ``rows``, the
``files`` written):

- ``ppo``: recurrent PPO on windows or stream chunks, the main job (``seqchunk ppo``);
- ``dqn``: recurrent double n-step DQN from replay, its replay in ``dqn_replay`` (``seqchunk dqn``);
- ``curriculum``: the main job's PPO with a reverse curriculum from one demo (``seqchunk curriculum``);
- ``world_model``: a next-frame world model on stream chunks of Atari frames (``seqchunk world-model``);
- ``distributed_ppo``: the main job on learner processes and env workers (``seqchunk distributed-ppo``).

From Python, on any gymnasium id::

    from torchrl_seqchunk.recipes import ppo
    run = ppo.train(ppo.Config(env="Pendulum-v1", keep="0,1"))  # runs/Pendulum-v1_keep0,1_reset_continue_seed0/

``cli`` is the ``seqchunk`` command (also ``python -m torchrl_seqchunk.recipes``); what the
recipes share (envs, agent, batching, PPO steps, run folder and report, option checks) is the
toolkit in ``common/``; the demos the curriculum recipe starts from ship in ``data/``.
"""
