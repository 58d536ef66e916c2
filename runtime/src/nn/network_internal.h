// What network.cpp (shape inference) and network_text.cpp (the canonical text) share. Internal to the runtime.
#pragma once
#include <string>

#include "gpunodes/nn/layers.h"

namespace gn::nn {

// A shape as the canonical text and the shape errors write it: 1x28x28, "scalar" for no dimensions.
std::string dims_text(const Shape& s);

}  // namespace gn::nn
