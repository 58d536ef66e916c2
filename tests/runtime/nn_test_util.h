// Shared by the training-layer suites.
#pragma once
#include <cstdint>

#include "gpunodes/nn/model.h"

namespace gn::nn {

// The default options of `arch`, with its parameters drawn from `seed`.
inline ModelOptions modelOptions(Arch arch, uint64_t seed = 0) {
  ModelOptions o;
  o.arch = arch;
  o.seed = seed;
  return o;
}

}  // namespace gn::nn
