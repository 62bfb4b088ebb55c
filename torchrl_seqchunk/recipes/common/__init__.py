"""What the recipes share, one job per module:

- ``options``: the command line from a Config dataclass (tyro) and the option checks every recipe uses;
- ``config``: the main job's Config, recurrent PPO's hyperparameters, each checked;
- ``envs``: the main job's batched, transformed env and its acting variant (the agent's primers);
- ``agent``: the recurrent actor-critic (encoder -> ResetRNN -> head);
- ``batching``: rollout -> batches, windows or stream chunks, each with its loss;
- ``ppo``: advantages, the PPO update and the schedules;
- ``report``: the run folder, metrics.csv, the progress bar and learning_curve.png;
- ``loopback``: torch.distributed's rendezvous and process group bound to 127.0.0.1.
"""
