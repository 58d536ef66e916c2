#include "gpunodes/device.h"

#include <charconv>

namespace gn {

std::string Device::str() const {
  if (kind == DeviceKind::Cpu) return index == 0 ? "cpu" : "cpu:" + std::to_string(index);
  return "cuda:" + std::to_string(index);
}

std::optional<Device> Device::parse(std::string_view text) {
  std::string_view name = text, number;
  if (auto colon = text.find(':'); colon != std::string_view::npos) {
    name = text.substr(0, colon);
    number = text.substr(colon + 1);
  }
  DeviceKind kind;
  if (name == "cpu") {
    kind = DeviceKind::Cpu;
  } else if (name == "cuda" || name == "gpu") {
    kind = DeviceKind::Cuda;
  } else {
    return std::nullopt;
  }
  int index = 0;
  if (!number.empty()) {
    auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), index);
    if (ec != std::errc() || end != number.data() + number.size() || index < 0) return std::nullopt;
  }
  return Device{kind, index};
}

const char* stream_name(StreamKind s) {
  switch (s) {
    case StreamKind::Compute:
      return "compute";
    case StreamKind::Copy:
      return "copy";
    case StreamKind::Collective:
      return "collective";
  }
  return "?";
}

}  // namespace gn
