// safetensors (see safetensors.h): a small JSON reader and writer for its flat header, the layout checks, and
// the match with a model. Every check runs before the first value is written to the model.
#include "gpunodes/nn/safetensors.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "gpunodes/errors.h"
#include "gpunodes/nn/serialize.h"

namespace gn::nn {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace {

// Far past any real header (ResNet-18's is 10 KB), and the reference reader's own limit.
constexpr uint64_t kMaxHeaderBytes = uint64_t(100) << 20;
// Deeper nesting than the format's three levels is hostile; the parser is recursive.
constexpr int kMaxDepth = 32;
constexpr size_t kMaxRank = 16;
// Far past any real checkpoint (a large language model's shard holds a few thousand); bounds the memory a
// hostile header of many tiny entries costs.
constexpr size_t kMaxEntries = size_t(1) << 17;
constexpr const char* kSignatureKey = "gpunodes.signature";
constexpr const char* kBatchesTracked = "num_batches_tracked";

// --- JSON --------------------------------------------------------------------------------------------------

// A JSON value as far as the header needs to know it: strings and exact integers kept, arrays and objects in
// places where the format has none only classified (and skipped). The header's own arrays and objects are
// read in place by the parser below, so that no tree is built: a hostile 100 MiB header costs about its own
// size in memory, not many times that.
struct Scalar {
  enum Kind { Null, Bool, Int, Float, String, Array, Object } kind = Null;
  int64_t i = 0;
  std::string s;  // a String's value; a Float's text (also an integer past int64), for messages
};

const char* kind_name(Scalar::Kind k) {
  switch (k) {
    case Scalar::Null:
      return "null";
    case Scalar::Bool:
      return "a boolean";
    case Scalar::Int:
      return "an integer";
    case Scalar::Float:
      return "a non-integer number";
    case Scalar::String:
      return "a string";
    case Scalar::Array:
      return "an array";
    case Scalar::Object:
      return "an object";
  }
  return "?";
}

std::string show(const Scalar& v) {
  if (v.kind == Scalar::Int) return std::to_string(v.i);
  if (v.kind == Scalar::Float) return v.s;
  if (v.kind == Scalar::String) return "\"" + v.s + "\"";
  return kind_name(v.kind);
}

class JsonReader {
 public:
  JsonReader(const char* p, size_t n, std::string where) : p_(p), n_(n), where_(std::move(where)) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(where_ + "the header is not valid JSON: " + what + " (at byte " + std::to_string(pos_) +
                " of the header)");
  }
  void ws() {
    while (pos_ < n_ && (p_[pos_] == ' ' || p_[pos_] == '\t' || p_[pos_] == '\n' || p_[pos_] == '\r')) ++pos_;
  }
  char peek() {
    ws();
    if (pos_ >= n_) fail("it ends early");
    return p_[pos_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  // After an opening '{' or '[': true (and consumed) when the closing one follows at once.
  bool empty_then(char close) {
    if (peek() != close) return false;
    ++pos_;
    return true;
  }
  // After a member or item: true when another follows (the ',' consumed), false at `close` (consumed).
  bool more(char close) {
    const char c = peek();
    ++pos_;
    if (c == ',') return true;
    if (c != close) {
      --pos_;
      fail(std::string("expected ',' or '") + close + "'");
    }
    return false;
  }
  void end() {
    ws();
    if (pos_ != n_) fail("unexpected text after the top-level object");
  }

  // Any value; arrays and objects are checked and skipped (nesting bounded: the skip is recursive).
  Scalar value(int depth = 0) {
    if (depth > kMaxDepth) fail("nested deeper than " + std::to_string(kMaxDepth) + " levels");
    Scalar v;
    const char c = peek();
    if (c == '{' || c == '[') {
      const char close = c == '{' ? '}' : ']';
      v.kind = c == '{' ? Scalar::Object : Scalar::Array;
      ++pos_;
      if (empty_then(close)) return v;
      do {
        if (c == '{') {
          if (peek() != '"') fail("expected a string key");
          string();
          expect(':');
        }
        value(depth + 1);
      } while (more(close));
      return v;
    }
    if (c == '"') {
      v.kind = Scalar::String;
      v.s = string();
      return v;
    }
    if (c == 't' || c == 'f') {
      literal(c == 't' ? "true" : "false");
      v.kind = Scalar::Bool;
      v.i = c == 't';
      return v;
    }
    if (c == 'n') {
      literal("null");
      return v;
    }
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    fail("unexpected character");
  }

  std::string string() {
    expect('"');
    std::string out;
    for (;;) {
      if (pos_ >= n_) fail("it ends early");
      const char c = p_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) {
        --pos_;
        fail("a control character inside a string");
      }
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= n_) fail("it ends early");
      const char e = p_[pos_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out += e;
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) fail("a lone low surrogate");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (n_ - pos_ < 2 || p_[pos_] != '\\' || p_[pos_ + 1] != 'u') fail("a lone high surrogate");
            pos_ += 2;
            const unsigned lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("a high surrogate without its low half");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          utf8(out, cp);
          break;
        }
        default:
          --pos_;
          fail("an unknown escape");
      }
    }
  }

 private:
  void literal(const char* word) {
    const size_t n = std::strlen(word);
    if (n_ - pos_ < n || std::memcmp(p_ + pos_, word, n) != 0) fail("unexpected character");
    pos_ += n;
  }

  bool digit() const { return pos_ < n_ && p_[pos_] >= '0' && p_[pos_] <= '9'; }

  Scalar number() {
    const size_t start = pos_;
    bool integral = true;
    if (p_[pos_] == '-') ++pos_;
    if (!digit()) fail("a number without digits");
    if (p_[pos_] == '0')
      ++pos_;
    else
      while (digit()) ++pos_;
    if (pos_ < n_ && p_[pos_] == '.') {
      integral = false;
      ++pos_;
      if (!digit()) fail("a number without digits after '.'");
      while (digit()) ++pos_;
    }
    if (pos_ < n_ && (p_[pos_] == 'e' || p_[pos_] == 'E')) {
      integral = false;
      ++pos_;
      if (pos_ < n_ && (p_[pos_] == '+' || p_[pos_] == '-')) ++pos_;
      if (!digit()) fail("a number without digits in its exponent");
      while (digit()) ++pos_;
    }
    Scalar v;
    v.s.assign(p_ + start, pos_ - start);
    v.kind = Scalar::Float;
    if (!integral) return v;
    // Exact integers only: a dimension or offset must not pass through a double.
    const bool negative = v.s[0] == '-';
    uint64_t mag = 0;
    for (size_t k = negative ? 1 : 0; k < v.s.size(); ++k) {
      const unsigned d = static_cast<unsigned>(v.s[k] - '0');
      if (mag > (std::numeric_limits<uint64_t>::max() - d) / 10) return v;  // past 64 bits: stays Float
      mag = mag * 10 + d;
    }
    const uint64_t limit = negative ? uint64_t(1) << 63 : (uint64_t(1) << 63) - 1;
    if (mag > limit) return v;
    v.kind = Scalar::Int;
    v.i = negative ? static_cast<int64_t>(0 - mag) : static_cast<int64_t>(mag);
    return v;
  }

  unsigned hex4() {
    if (n_ - pos_ < 4) fail("a \\u escape cut short");
    unsigned u = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = p_[pos_++];
      u <<= 4;
      if (h >= '0' && h <= '9')
        u |= static_cast<unsigned>(h - '0');
      else if (h >= 'a' && h <= 'f')
        u |= static_cast<unsigned>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F')
        u |= static_cast<unsigned>(h - 'A' + 10);
      else
        fail("a bad \\u escape");
    }
    return u;
  }

  static void utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  const char* p_;
  size_t n_, pos_ = 0;
  std::string where_;
};

void json_string(std::string& out, const std::string& s) {
  static const char* hex = "0123456789abcdef";
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      out += "\\u00";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += ch;  // UTF-8 passes through, as JSON allows
    }
  }
  out += '"';
}

// --- dtypes ------------------------------------------------------------------------------------------------

struct Dtype {
  const char* name;
  uint64_t size;
};
// Every dtype of the reference implementation with a whole number of bytes per element: the layout of any
// of them can be checked, though only the floating ones load into parameters.
constexpr Dtype kDtypes[] = {{"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
                             {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
                             {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};

const Dtype* find_dtype(const std::string& name) {
  for (const Dtype& d : kDtypes)
    if (name == d.name) return &d;
  return nullptr;
}

bool loads_as_float(const std::string& dtype) {
  return dtype == "F32" || dtype == "F16" || dtype == "BF16" || dtype == "F64";
}

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h >> 15) << 31;
  const uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (man << 13);  // inf, nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);  // rebias 15 -> 127
  } else {
    // Zero or subnormal: exact in float32 as man * 2^-24.
    const float f = std::ldexp(static_cast<float>(man), -24);
    return sign ? -f : f;
  }
  return std::bit_cast<float>(bits);
}

std::vector<float> to_floats(const char* data, const SafetensorsEntry& t, size_t count) {
  std::vector<float> v(count);
  if (t.dtype == "F32") {
    std::memcpy(v.data(), data, count * 4);
  } else if (t.dtype == "F64") {
    for (size_t k = 0; k < count; ++k) {
      double d;
      std::memcpy(&d, data + 8 * k, 8);
      v[k] = static_cast<float>(d);
    }
  } else {
    for (size_t k = 0; k < count; ++k) {
      uint16_t h;
      std::memcpy(&h, data + 2 * k, 2);
      // bfloat16 is the top half of a float32.
      v[k] = t.dtype == "BF16" ? std::bit_cast<float>(uint32_t(h) << 16) : half_to_float(h);
    }
  }
  return v;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::string offsets_str(const SafetensorsEntry& t) {
  return "[" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "]";
}

// "<prefix>num_batches_tracked" for a BatchNorm layer, from its running_var's name; empty for other names.
std::string batches_tracked_name(const std::string& state_name) {
  if (!ends_with(state_name, "running_var")) return {};
  return state_name.substr(0, state_name.size() - std::strlen("running_var")) + kBatchesTracked;
}

}  // namespace

const std::string* SafetensorsHeader::find_metadata(const std::string& key) const {
  for (const auto& [k, v] : metadata)
    if (k == key) return &v;
  return nullptr;
}

std::vector<char> float_bytes(const std::vector<float>& values) {
  const char* b = reinterpret_cast<const char*>(values.data());
  return std::vector<char>(b, b + values.size() * sizeof(float));
}

bool looks_like_safetensors(const char* bytes, size_t size) {
  return size > 8 && bytes[8] == '{';
}

namespace {

// One tensor's {"dtype", "shape", "data_offsets"}, checked against the data region of `data_size` bytes.
SafetensorsEntry read_tensor(JsonReader& r, std::string name, const std::string& corrupt,
                             uint64_t data_size) {
  const std::string what = corrupt + "tensor '" + name + "' ";
  SafetensorsEntry t;
  t.name = std::move(name);
  if (r.peek() != '{') throw Error(what + "is " + kind_name(r.value(1).kind) + ", not an object");
  r.expect('{');
  bool has_dtype = false, has_shape = false;
  std::vector<Scalar> offsets;
  bool has_offsets = false;
  if (!r.empty_then('}')) {
    do {
      if (r.peek() != '"') r.fail("expected a string key");
      const std::string field = r.string();
      r.expect(':');
      if ((field == "dtype" && has_dtype) || (field == "shape" && has_shape) ||
          (field == "data_offsets" && has_offsets))
        throw Error(what + "has its " + field + " twice");
      if (field == "dtype") {
        const Scalar v = r.value(2);
        if (v.kind != Scalar::String) throw Error(what + "has a dtype that is " + kind_name(v.kind));
        t.dtype = v.s;
        has_dtype = true;
      } else if (field == "shape") {
        if (r.peek() != '[') throw Error(what + "has a shape that is " + kind_name(r.value(2).kind));
        r.expect('[');
        if (!r.empty_then(']')) {
          do {
            const Scalar d = r.value(3);
            if (d.kind != Scalar::Int || d.i < 0)
              throw Error(what + "has a shape entry " + show(d) + ", not a non-negative integer");
            if (t.shape.size() == kMaxRank) throw Error(what + "has a rank over " + std::to_string(kMaxRank));
            t.shape.push_back(d.i);
          } while (r.more(']'));
        }
        has_shape = true;
      } else if (field == "data_offsets") {
        if (r.peek() != '[') throw Error(what + "has data_offsets that are " + kind_name(r.value(2).kind));
        r.expect('[');
        if (!r.empty_then(']')) {
          do {
            const Scalar o = r.value(3);
            if (o.kind != Scalar::Int || o.i < 0)
              throw Error(what + "has a data offset " + show(o) + ", not a non-negative integer");
            if (offsets.size() == 2) throw Error(what + "has more than two data_offsets");
            offsets.push_back(o);
          } while (r.more(']'));
        }
        if (offsets.size() != 2)
          throw Error(what + "has " + std::to_string(offsets.size()) + " data_offsets, not two");
        has_offsets = true;
      } else {
        throw Error(what + "has an unknown field '" + field + "' (expected dtype, shape, data_offsets)");
      }
    } while (r.more('}'));
  }
  if (!has_dtype || !has_shape || !has_offsets)
    throw Error(what + "lacks its " + (!has_dtype ? "dtype" : !has_shape ? "shape" : "data_offsets"));

  const Dtype* dt = find_dtype(t.dtype);
  if (!dt) throw Error(what + "has an unknown dtype '" + t.dtype + "'");
  // Bounded by the data there is, so numel * itemsize cannot overflow.
  uint64_t numel = 1;
  if (std::find(t.shape.begin(), t.shape.end(), 0) != t.shape.end()) {
    numel = 0;
  } else {
    for (int64_t d : t.shape) {
      if (static_cast<uint64_t>(d) > data_size / (numel * dt->size))
        throw Error(what + "has shape " + shape_str(t.shape) + ", more than the " +
                    std::to_string(data_size) + " bytes of data hold");
      numel *= static_cast<uint64_t>(d);
    }
  }
  t.begin = static_cast<uint64_t>(offsets[0].i);
  t.end = static_cast<uint64_t>(offsets[1].i);
  if (t.begin > t.end)
    throw Error(what + "has data_offsets " + offsets_str(t) + " that end before they begin");
  if (t.end > data_size)
    throw Error(what + "has data_offsets " + offsets_str(t) + " past the end of the data (" +
                std::to_string(data_size) + " bytes)");
  if (t.end - t.begin != numel * dt->size)
    throw Error(what + "(" + t.dtype + " " + shape_str(t.shape) + ") needs " +
                std::to_string(numel * dt->size) + " bytes, but its data_offsets " + offsets_str(t) +
                " span " + std::to_string(t.end - t.begin));
  return t;
}

// The first name that appears twice, or nullptr; sorts pointers, not the names.
const std::string* first_duplicate(std::vector<const std::string*> names) {
  std::sort(names.begin(), names.end(), [](const std::string* a, const std::string* b) { return *a < *b; });
  for (size_t k = 1; k < names.size(); ++k)
    if (*names[k] == *names[k - 1]) return names[k];
  return nullptr;
}

}  // namespace

SafetensorsHeader parse_safetensors(const std::vector<char>& file, const std::string& path) {
  const std::string corrupt = "safetensors file " + path + " is corrupt: ";
  if (file.size() < 8) throw Error(corrupt + "it is too short for the 8-byte header length");
  uint64_t n;
  std::memcpy(&n, file.data(), 8);
  const uint64_t after = file.size() - 8;
  if (n < 2) throw Error(corrupt + "header length " + std::to_string(n) + " is too small (at least 2, '{}')");
  if (n > kMaxHeaderBytes)
    throw Error(corrupt + "header length " + std::to_string(n) + " is over the " +
                format_bytes(static_cast<int64_t>(kMaxHeaderBytes)) + " limit for a header");
  if (n > after)
    throw Error(corrupt + "header length " + std::to_string(n) + " is past the end of the file (" +
                std::to_string(after) + " bytes follow it)");

  SafetensorsHeader h;
  h.data_start = 8 + n;
  const uint64_t data_size = after - n;
  JsonReader r(file.data() + 8, static_cast<size_t>(n), corrupt);
  if (r.peek() != '{')
    throw Error(corrupt + "the header is " + kind_name(r.value().kind) + ", not an object");
  r.expect('{');
  bool has_metadata = false;
  if (!r.empty_then('}')) {
    do {
      if (r.peek() != '"') r.fail("expected a string key");
      std::string name = r.string();
      r.expect(':');
      if (name != "__metadata__") {
        if (h.tensors.size() == kMaxEntries)
          throw Error(corrupt + "it lists more than " + std::to_string(kMaxEntries) + " tensors");
        h.tensors.push_back(read_tensor(r, std::move(name), corrupt, data_size));
        continue;
      }
      if (has_metadata) throw Error(corrupt + "'__metadata__' appears twice in the header");
      has_metadata = true;
      if (r.peek() != '{')
        throw Error(corrupt + "__metadata__ is " + kind_name(r.value(1).kind) + ", not an object of strings");
      r.expect('{');
      if (r.empty_then('}')) continue;
      do {
        if (r.peek() != '"') r.fail("expected a string key");
        std::string key = r.string();
        r.expect(':');
        Scalar value = r.value(2);
        if (value.kind != Scalar::String)
          throw Error(corrupt + "__metadata__ entry '" + key + "' is " + kind_name(value.kind) +
                      ", not a string");
        if (h.metadata.size() == kMaxEntries)
          throw Error(corrupt + "its __metadata__ has more than " + std::to_string(kMaxEntries) + " entries");
        h.metadata.emplace_back(std::move(key), std::move(value.s));
      } while (r.more('}'));
    } while (r.more('}'));
  }
  r.end();

  std::vector<const std::string*> names;
  for (const SafetensorsEntry& t : h.tensors) names.push_back(&t.name);
  if (const std::string* dup = first_duplicate(std::move(names)))
    throw Error(corrupt + "tensor '" + *dup + "' appears twice in the header");
  names.clear();
  for (const auto& [key, value] : h.metadata) names.push_back(&key);
  if (const std::string* dup = first_duplicate(std::move(names)))
    throw Error(corrupt + "__metadata__ entry '" + *dup + "' appears twice");

  // No two tensors may share bytes: writing one would change the other.
  std::vector<const SafetensorsEntry*> by_begin;
  for (const SafetensorsEntry& t : h.tensors)
    if (t.end > t.begin) by_begin.push_back(&t);
  std::sort(by_begin.begin(), by_begin.end(),
            [](const SafetensorsEntry* a, const SafetensorsEntry* b) { return a->begin < b->begin; });
  for (size_t k = 1; k < by_begin.size(); ++k)
    if (by_begin[k]->begin < by_begin[k - 1]->end)
      throw Error(corrupt + "tensors '" + by_begin[k - 1]->name + "' " + offsets_str(*by_begin[k - 1]) +
                  " and '" + by_begin[k]->name + "' " + offsets_str(*by_begin[k]) + " overlap");
  return h;
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  const std::vector<char> file = read_params_file(path);
  if (!looks_like_safetensors(file.data(), file.size()))
    throw Error("parameter file " + path +
                " is not a safetensors file (no JSON header after an 8-byte length)");
  return parse_safetensors(file, path);
}

std::vector<char> encode_safetensors(const std::vector<std::pair<std::string, std::string>>& metadata,
                                     const std::vector<SafetensorsBlob>& tensors) {
  // Data laid out widest element first, so that every tensor is aligned to its element size (as the
  // reference writer does); the header keeps the order given.
  std::vector<size_t> layout(tensors.size());
  for (size_t k = 0; k < layout.size(); ++k) layout[k] = k;
  auto element = [&](size_t k) {
    const Dtype* d = find_dtype(tensors[k].dtype);
    if (!d) throw Error("safetensors: unknown dtype " + tensors[k].dtype + " for '" + tensors[k].name + "'");
    return d->size;
  };
  std::stable_sort(layout.begin(), layout.end(), [&](size_t a, size_t b) { return element(a) > element(b); });
  std::vector<uint64_t> begin(tensors.size());
  uint64_t offset = 0;
  for (size_t k : layout) {
    const SafetensorsBlob& t = tensors[k];
    uint64_t count = 1;
    for (int64_t d : t.shape) count *= static_cast<uint64_t>(d);
    if (count * element(k) != t.bytes.size())
      throw Error("safetensors: '" + t.name + "' holds " + std::to_string(t.bytes.size()) +
                  " bytes, not the " + std::to_string(count * element(k)) + " of " + t.dtype + " " +
                  shape_str(t.shape));
    begin[k] = offset;
    offset += t.bytes.size();
  }

  std::string header = "{\"__metadata__\":{";
  for (size_t k = 0; k < metadata.size(); ++k) {
    if (k) header += ',';
    json_string(header, metadata[k].first);
    header += ':';
    json_string(header, metadata[k].second);
  }
  header += '}';
  for (size_t k = 0; k < tensors.size(); ++k) {
    const SafetensorsBlob& t = tensors[k];
    header += ',';
    json_string(header, t.name);
    header += ":{\"dtype\":\"" + t.dtype + "\",\"shape\":[";
    for (size_t d = 0; d < t.shape.size(); ++d) header += (d ? "," : "") + std::to_string(t.shape[d]);
    header += "],\"data_offsets\":[" + std::to_string(begin[k]) + "," +
              std::to_string(begin[k] + t.bytes.size()) + "]}";
  }
  header += '}';
  header.append((8 - header.size() % 8) % 8, ' ');

  std::vector<char> buf;
  buf.reserve(8 + header.size() + offset);
  const uint64_t n = header.size();
  buf.insert(buf.end(), reinterpret_cast<const char*>(&n), reinterpret_cast<const char*>(&n) + 8);
  buf.insert(buf.end(), header.begin(), header.end());
  for (size_t k : layout) buf.insert(buf.end(), tensors[k].bytes.begin(), tensors[k].bytes.end());
  return buf;
}

void save_safetensors(const Model& model, const std::string& path) {
  // Header entries in state order, each BatchNorm's counter after its running_var, as PyTorch's state_dict.
  const int64_t tracked = model.batches_tracked();
  std::vector<SafetensorsBlob> tensors;
  for (const Parameter* p : model.state()) {
    tensors.push_back({p->name, "F32", p->value.shape(), float_bytes(to_host(p->value))});
    if (std::string c = batches_tracked_name(p->name); !c.empty())
      tensors.push_back({std::move(c),
                         "I64",
                         {},
                         std::vector<char>(reinterpret_cast<const char*>(&tracked),
                                           reinterpret_cast<const char*>(&tracked) + 8)});
  }
  write_params_file(path,
                    encode_safetensors({{"format", "pt"}, {kSignatureKey, model.signature()}}, tensors));
}

void load_safetensors(Model& model, const std::vector<char>& file, const std::string& path) {
  const SafetensorsHeader h = parse_safetensors(file, path);
  const std::string where = "safetensors file " + path + ": ";
  // Which model the file was saved from, when gpunodes wrote it: the likeliest reason for a mismatch.
  std::string holds;
  if (const std::string* sig = h.find_metadata(kSignatureKey); sig && *sig != model.signature())
    holds = " (the file holds a '" + *sig + "' model; this one is a '" + model.signature() + "')";

  std::unordered_map<std::string, const SafetensorsEntry*> by_name;
  for (const SafetensorsEntry& t : h.tensors) by_name.emplace(t.name, &t);
  auto state = model.state();
  std::vector<const SafetensorsEntry*> source;
  std::unordered_set<std::string> known, counters;
  for (Parameter* p : state) {
    known.insert(p->name);
    if (std::string c = batches_tracked_name(p->name); !c.empty()) counters.insert(std::move(c));
    const auto it = by_name.find(p->name);
    if (it == by_name.end())
      throw Error(where + "tensor '" + p->name + "' " + shape_str(p->value.shape()) +
                  " that the model expects is missing from the file" + holds);
    const SafetensorsEntry& t = *it->second;
    if (!loads_as_float(t.dtype))
      throw Error(where + "tensor '" + t.name + "' has dtype " + t.dtype +
                  "; parameters load from F32, F16, BF16 or F64");
    if (t.shape != p->value.shape())
      throw Error(where + "tensor '" + t.name + "' has shape " + shape_str(t.shape) +
                  " in the file but the model expects " + shape_str(p->value.shape()) + holds);
    source.push_back(&t);
  }
  int64_t tracked = -1;
  for (const SafetensorsEntry& t : h.tensors) {
    if (known.count(t.name)) continue;
    if (!counters.count(t.name))
      throw Error(where + "tensor '" + t.name + "' " + shape_str(t.shape) +
                  " in the file is not a parameter or buffer of the model" + holds);
    if (t.dtype != "I64" || !t.shape.empty())
      throw Error(where + "tensor '" + t.name + "' is " + t.dtype + " " + shape_str(t.shape) +
                  "; a BatchNorm's num_batches_tracked is an I64 scalar (shape [])");
    int64_t v;
    std::memcpy(&v, file.data() + h.data_start + t.begin, 8);
    if (v < 0) throw Error(where + "tensor '" + t.name + "' is negative (" + std::to_string(v) + ")");
    tracked = std::max(tracked, v);
  }

  for (size_t k = 0; k < state.size(); ++k) {
    const SafetensorsEntry& t = *source[k];
    write_values(state[k]->value, to_floats(file.data() + h.data_start + t.begin, t,
                                            static_cast<size_t>(state[k]->value.numel())));
  }
  if (tracked >= 0) model.set_batches_tracked(tracked);
}

}  // namespace gn::nn
