// train_bench's attention rows (attention_bench.cpp): Vision Transformer training against PyTorch in the same
// run.
#pragma once

namespace gn::bench {

// Prints the rows: d2l 11.8's ViT at the quick settings of resources/examples/vit-fashion-mnist.json
// (28x28 Fashion-MNIST-sized images, patch 4, width 64, 4 heads, 2 pre-norm blocks, MLP 128, batch 128,
// Adam; no dropout on either side) training images/s against torch (nn.TransformerEncoderLayer with
// norm_first=True, activation="gelu") with the same model, batch and threads, and the step's peak memory
// against its live set. With `profile`, also where a step's time goes: the engine's op spans summed by op.
void attention_rows(int threads, int steps, bool profile);

}  // namespace gn::bench
