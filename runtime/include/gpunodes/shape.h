#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace gn {

using Shape = std::vector<int64_t>;

// Number of elements, refusing negative dimensions and sizes whose element or byte count overflows
// 64 bits, before anything is allocated. Throws ShapeError.
int64_t checked_numel(const Shape& shape);
std::string shape_str(const Shape& shape);

}  // namespace gn
