// Reading data files whole, UTF-8 checks, numbers and the CSV reader of the text, series and table loaders.
#include "data_files.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>

#include "gpunodes/errors.h"

namespace gn::nn {

int64_t default_max_file_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return std::numeric_limits<int64_t>::max();
  return static_cast<int64_t>(pages) * page / 32;
}

std::string read_data_file(const std::string& path, int64_t max_bytes, const std::string& kind) {
  namespace fs = std::filesystem;
  if (path.empty()) throw Error(kind + ": no file given");
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status)) throw Error(kind + ": " + path + " does not exist");
  if (fs::is_directory(status)) throw Error(kind + ": " + path + " is a directory, not a file");
  if (!fs::is_regular_file(status)) throw Error(kind + ": " + path + " is not a regular file");
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) throw Error(kind + ": cannot read the size of " + path + ": " + ec.message());
  if (size == 0) throw Error(kind + ": " + path + " is empty");
  const int64_t limit = max_bytes > 0 ? max_bytes : default_max_file_bytes();
  if (size > static_cast<uintmax_t>(limit))
    throw Error(kind + ": " + path + " is " + format_bytes(static_cast<int64_t>(size)) + ", more than the " +
                format_bytes(limit) + " this loader reads" +
                (max_bytes > 0 ? std::string(" (its max_bytes)")
                               : std::string(" (1/32 of this machine's memory: loading takes about 14 bytes "
                                             "per byte of text)")));
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw Error(kind + ": cannot open " + path + ": " + std::strerror(errno));
  std::string data(static_cast<size_t>(size), '\0');
  const size_t got = std::fread(data.data(), 1, data.size(), f);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) throw Error(kind + ": cannot read " + path + ": " + std::strerror(errno));
  // A file that shrank since its size was read ends where it ends now.
  data.resize(got);
  if (data.empty()) throw Error(kind + ": " + path + " is empty");
  return data;
}

TextPosition position_of(std::string_view text, size_t offset) {
  TextPosition p;
  offset = std::min(offset, text.size());
  size_t line_start = 0;
  for (size_t i = 0; i < offset; ++i)
    if (text[i] == '\n') ++p.line, line_start = i + 1;
  for (size_t i = line_start; i < offset; ++i)
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) ++p.column;  // not a continuation byte
  return p;
}

std::string describe_position(std::string_view text, size_t offset) {
  const TextPosition p = position_of(text, offset);
  return "line " + std::to_string(p.line) + ", column " + std::to_string(p.column) + " (byte offset " +
         std::to_string(offset) + ")";
}

size_t utf8_sequence_length(unsigned char lead) {
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 1;
}

void check_utf8_text(std::string_view text, const std::string& kind, const std::string& what) {
  auto bad = [&](size_t at, const std::string& why) {
    throw Error(kind + ": " + what + " is not UTF-8 text: " + why + " at " + describe_position(text, at));
  };
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = s[i];
    if (c == 0) bad(i, "a NUL byte (a binary file, or text in UTF-16 or UTF-32)");
    if (c < 0x80) {
      ++i;
      continue;
    }
    const size_t len = utf8_sequence_length(c);
    char byte[8];
    std::snprintf(byte, sizeof byte, "0x%02X", c);
    if (len == 1) bad(i, std::string("the byte ") + byte);
    if (i + len > n) bad(i, std::string("a sequence cut short by the end (lead byte ") + byte + ")");
    for (size_t k = 1; k < len; ++k)
      if ((s[i + k] & 0xC0) != 0x80) bad(i, std::string("a broken sequence (lead byte ") + byte + ")");
    // The second byte's range rules out overlong forms, UTF-16 surrogates and code points past U+10FFFF.
    const unsigned char second = s[i + 1];
    if ((c == 0xE0 && second < 0xA0) || (c == 0xF0 && second < 0x90))
      bad(i, std::string("an overlong sequence (lead byte ") + byte + ")");
    if (c == 0xED && second >= 0xA0) bad(i, "a UTF-16 surrogate");
    if (c == 0xF4 && second >= 0x90) bad(i, "a code point beyond U+10FFFF");
    i += len;
  }
}

std::string_view without_bom(std::string_view text) {
  return text.substr(0, 3) == "\xEF\xBB\xBF" ? text.substr(3) : text;
}

namespace {
std::string_view trimmed(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}
}  // namespace

bool parse_number(std::string_view text, double& value) {
  text = trimmed(text);
  if (!text.empty() && text.front() == '+') {
    text.remove_prefix(1);
    if (!text.empty() && text.front() == '-') return false;  // from_chars would take "+-1"
  }
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v)) return false;
  value = v;
  return true;
}

std::string quote_for_message(std::string_view text, size_t max_chars) {
  std::string out = "'";
  size_t chars = 0, i = 0;
  while (i < text.size() && chars < max_chars) {
    const size_t len = std::min(utf8_sequence_length(static_cast<unsigned char>(text[i])), text.size() - i);
    out.append(text.substr(i, len));
    i += len, ++chars;
  }
  out += i < text.size() ? "...' (" + std::to_string(text.size()) + " bytes)" : "'";
  return out;
}

// --- CSV ---------------------------------------------------------------------------------------------------

CsvReader::CsvReader(std::string_view text, std::string kind, std::string path)
    : text_(text), kind_(std::move(kind)), path_(std::move(path)) {}

std::string CsvReader::where() const {
  return kind_ + ": " + path_ + ", line " + std::to_string(record_line_);
}

void CsvReader::fail(const std::string& what) const {
  throw Error(where() + ": " + what);
}

bool CsvReader::next(std::vector<std::string>& fields) {
  const size_t n = text_.size();
  // Empty lines hold no record.
  while (at_ < n && (text_[at_] == '\n' || (text_[at_] == '\r' && at_ + 1 < n && text_[at_ + 1] == '\n'))) {
    at_ += text_[at_] == '\r' ? 2 : 1;
    ++line_;
  }
  if (at_ >= n) return false;
  record_line_ = line_;
  size_t count = 0;
  auto field = [&]() -> std::string& {
    if (fields.size() <= count) fields.emplace_back();
    std::string& f = fields[count++];
    f.clear();
    return f;
  };
  // LF, CRLF, or a CR that ends the text.
  auto at_record_end = [&](size_t i) {
    return i >= n || text_[i] == '\n' || (text_[i] == '\r' && (i + 1 == n || text_[i + 1] == '\n'));
  };
  for (;;) {
    std::string& f = field();
    size_t i = at_;
    while (i < n && (text_[i] == ' ' || text_[i] == '\t')) ++i;
    if (i < n && text_[i] == '"') {
      const int64_t open_line = line_;
      const size_t open = i;
      ++i;
      for (;;) {
        const size_t quote = text_.find('"', i);
        if (quote == std::string_view::npos) {
          record_line_ = open_line;
          fail("the quote at " + describe_position(text_, open) + ", which opens field " +
               std::to_string(count) + ", is never closed");
        }
        const std::string_view chunk = text_.substr(i, quote - i);
        for (char c : chunk) line_ += c == '\n';
        f.append(chunk);
        if (quote + 1 < n && text_[quote + 1] == '"') {
          f += '"';
          i = quote + 2;
          continue;
        }
        i = quote + 1;
        break;
      }
      while (i < n && (text_[i] == ' ' || text_[i] == '\t')) ++i;
      if (!at_record_end(i) && text_[i] != ',')
        fail("field " + std::to_string(count) + " has text after its closing quote: " +
             quote_for_message(text_.substr(i, std::min<size_t>(n - i, 20))));
    } else {
      size_t end = i;
      while (!at_record_end(end) && text_[end] != ',') ++end;
      f.append(trimmed(text_.substr(i, end - i)));
      i = end;
    }
    if (i < n && text_[i] == ',') {
      at_ = i + 1;
      continue;
    }
    if (i < n) {
      i = std::min(n, i + (text_[i] == '\r' ? 2 : 1));
      ++line_;
    }
    at_ = i;
    break;
  }
  fields.resize(count);
  return true;
}

int64_t CsvHeader::find(const std::string& name) const {
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return static_cast<int64_t>(i);
  return -1;
}

std::string CsvHeader::listed() const {
  constexpr size_t kListed = 30;  // a header of a million columns must not make a message of megabytes
  std::string out;
  for (size_t i = 0; i < names.size() && i < kListed; ++i)
    out += (i ? ", " : "") + quote_for_message(names[i]);
  if (names.size() > kListed) out += " and " + std::to_string(names.size() - kListed) + " more";
  return out;
}

CsvHeader read_csv_header(CsvReader& reader, const std::string& kind, const std::string& path) {
  CsvHeader header;
  if (!reader.next(header.names)) throw Error(kind + ": " + path + " holds no header row");
  std::map<std::string, size_t> seen;
  for (size_t i = 0; i < header.names.size(); ++i) {
    const auto [it, fresh] = seen.emplace(header.names[i], i);
    if (!fresh)
      throw Error(reader.where() + ": the header names the column " + quote_for_message(header.names[i]) +
                  " twice (columns " + std::to_string(it->second + 1) + " and " + std::to_string(i + 1) +
                  "), so a name cannot pick one");
  }
  return header;
}

void check_field_count(const CsvReader& reader, const std::vector<std::string>& fields,
                       const CsvHeader& header) {
  if (fields.size() != header.names.size())
    throw Error(reader.where() + " has " + std::to_string(fields.size()) +
                (fields.size() == 1 ? " field" : " fields") + ", but the header has " +
                std::to_string(header.names.size()));
}

void throw_not_a_number(const CsvReader& reader, const CsvHeader& header, size_t column,
                        std::string_view text) {
  throw Error(reader.where() + ": column " + quote_for_message(header.names[column]) + " (number " +
              std::to_string(column + 1) + ") holds " + quote_for_message(text) + ", which is not a number");
}

void throw_no_such_column(const std::string& kind, const std::string& path, const CsvHeader& header,
                          const std::string& name, const std::string& role) {
  const std::string columns = "; its columns are " + header.listed();
  if (name.empty()) throw Error(kind + ": no column is named as " + role + " of " + path + columns);
  throw Error(kind + ": " + path + " has no column " + quote_for_message(name) + " (" + role + ")" + columns);
}

}  // namespace gn::nn
