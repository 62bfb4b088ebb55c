import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.modules import LSTMModule
from torchrl_seqchunk import ChunkPrefetcher, ResetRNN, StreamChunkSampler

rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10_000), sampler=StreamChunkSampler(4, 16), batch_size=64)
done = torch.arange(1_000).remainder(50).eq(49).unsqueeze(-1)  # 20 episodes of 50 steps
rb.extend(TensorDict({"observation": torch.randn(1_000, 8), ("next", "done"): done}, [1_000]))
lstm = LSTMModule(input_size=8, hidden_size=32, in_key="observation", out_key="features")  # TorchRL's own
rnn = ResetRNN(lstm, default_recurrent_mode=True)  # resets at is_first, carries (h, c) across chunks
optim = torch.optim.Adam(rnn.parameters())
with ChunkPrefetcher(rb.sample, depth=2) as chunks:  # background thread, chunks in order
    for _, chunk in zip(range(10), chunks):  # chunk: [4, 16] streams x steps, "is_first" [4, 16, 1]
        loss = rnn(chunk)["features"].pow(2).mean()
        optim.zero_grad(); loss.backward(); optim.step()
print(chunk.batch_size, chunk["is_first"].sum().item(), loss.item())  # torch.Size([4, 16]), episode starts, loss
