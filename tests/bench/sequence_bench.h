// train_bench's sequence rows (sequence_bench.cpp): recurrent training against PyTorch in the same run.
#pragma once

namespace gn::bench {

// Prints the rows: a GRU language model's training tokens/s (d2l's vocabulary 28, hidden 256, 35 steps,
// batch 32) and an LSTM reading Fashion-MNIST rows (images/s), each against torch's nn.GRU / nn.LSTM with
// the same model, batch and threads; and the GRU step's peak memory against its live set.
void sequence_rows(int threads, int steps);

}  // namespace gn::bench
