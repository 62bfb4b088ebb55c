import torch
from torch import nn
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl_seqchunk import ChunkPrefetcher, ResetRNN, StreamChunkSampler

rb = TensorDictReplayBuffer(  # 4 streams, chunks of 16 steps
    storage=LazyTensorStorage(10_000), sampler=StreamChunkSampler(4, 16), batch_size=4 * 16)
done = torch.arange(1_000).remainder(50).eq(49).unsqueeze(-1)  # 20 episodes of 50 steps
rb.extend(TensorDict({"observation": torch.randn(1_000, 8), ("next", "done"): done}, [1_000]))
rnn = ResetRNN(nn.GRU(8, 32, batch_first=True), in_key="observation", default_recurrent_mode=True)
optim = torch.optim.Adam(rnn.parameters())
with ChunkPrefetcher(rb.sample, depth=2) as chunks:  # background thread, chunks in order
    for _, chunk in zip(range(10), chunks):  # chunk: [4, 16], "is_first" [4, 16, 1]
        loss = rnn(chunk)["features"].pow(2).mean()  # resets at is_first, carries h across chunks
        optim.zero_grad(); loss.backward(); optim.step()
