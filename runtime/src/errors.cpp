#include "gpunodes/errors.h"

#include <cstdio>

#include "gpunodes/shape.h"

namespace gn {

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while ((v >= 1024 || v <= -1024) && u < 6) {
    v /= 1024;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

static std::string oom_message(Device d, int64_t requested, int64_t free, int64_t cached, int64_t limit) {
  std::string msg = "Out of memory on " + d.str() + ": tried to allocate " + format_bytes(requested) + "; " +
                    format_bytes(free) + " free, " + format_bytes(cached) + " cached";
  if (limit > 0) msg += ", memory_limit " + format_bytes(limit);
  return msg;
}

OutOfMemoryError::OutOfMemoryError(Device d, int64_t req, int64_t fr, int64_t ca, int64_t lim)
    : Error(oom_message(d, req, fr, ca, lim)), device(d), requested(req), free(fr), cached(ca), limit(lim) {}

DeviceMismatchError::DeviceMismatchError(Device a, Device b)
    : Error("Expected all tensors to be on the same device, but found at least two devices, " + a.str() +
            " and " + b.str() + "!") {}

int64_t checked_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw ShapeError("shape " + shape_str(shape) + " has a negative dimension");
    // Element and byte counts must both fit in int64: refuse before anything is allocated.
    if (d != 0 && n > (INT64_MAX / static_cast<int64_t>(sizeof(float))) / d)
      throw ShapeError("shape " + shape_str(shape) + " is too large: its size overflows 64 bits");
    n *= d;
  }
  return n;
}

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace gn
