// What the text, series and table loaders (sequence_data.cpp, table_data.cpp) share: reading a data file
// whole with its size checked first, checking that it is UTF-8 text, positions for messages, numbers, and
// an RFC 4180 CSV reader. Every refusal is one gn::Error that names the file and where in it.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gn::nn {

// The host's physical memory / 32: the largest file a loader reads unless told otherwise. A byte of text can
// become a token that takes about 14 bytes while loading (its ids and its float window values), so this keeps
// a load under half of memory.
int64_t default_max_file_bytes();

// The whole file at `path`. Refused before reading when the path is empty, missing, a directory or anything
// but a regular file (a FIFO or device would block or never end), empty, or larger than max_bytes (0:
// default_max_file_bytes()). `kind` starts the message ("text", "series", "table").
std::string read_data_file(const std::string& path, int64_t max_bytes, const std::string& kind);

// Line and column (both from 1; the column counts characters, not bytes) of byte `offset` of UTF-8 text.
struct TextPosition {
  int64_t line = 1, column = 1;
};
TextPosition position_of(std::string_view text, size_t offset);
// "line 3, column 7 (byte offset 41)": for messages.
std::string describe_position(std::string_view text, size_t offset);

// Refuses text that is not UTF-8 (an invalid, overlong or surrogate sequence, or one beyond U+10FFFF) or that
// holds a NUL byte (a binary file, or UTF-16 / UTF-32 text), naming the byte offset, line and column.
// `what` names the text in the message: a file's path, or "the prompt".
void check_utf8_text(std::string_view text, const std::string& kind, const std::string& what);
// The text after a leading UTF-8 byte order mark, which editors on Windows write and is not content.
std::string_view without_bom(std::string_view text);
// Bytes in the UTF-8 sequence that starts with `lead` (1 for anything that is not a valid lead byte).
size_t utf8_sequence_length(unsigned char lead);

// A finite number in `text`, allowing spaces and tabs around it and a leading '+': what a CSV cell of a
// numeric column holds. False for anything else (empty, words, "nan", "inf", "1e999").
bool parse_number(std::string_view text, double& value);
// At most `max_chars` characters of text for a message, marked when cut.
std::string quote_for_message(std::string_view text, size_t max_chars = 40);

// Records of comma-separated values (RFC 4180): a record ends at LF or CRLF; a field in double quotes may
// hold commas, line ends and doubled quotes (""), and may be followed only by spaces or tabs before the next
// comma or the record's end. Unquoted fields lose their surrounding spaces and tabs, and a quote inside one
// is an ordinary character. Empty lines are skipped.
class CsvReader {
 public:
  // `text` must outlive the reader; kind and path name it in messages.
  CsvReader(std::string_view text, std::string kind, std::string path);
  // The next record into `fields` (their storage is reused); false after the last. Throws Error for a quote
  // never closed (naming the line and column where it opened) and for text after a closing quote.
  bool next(std::vector<std::string>& fields);
  // The line (from 1) the record last read starts on.
  int64_t line() const { return record_line_; }
  // "table: data.csv, line 7": how messages about the record last read begin.
  std::string where() const;

 private:
  [[noreturn]] void fail(const std::string& what) const;

  std::string_view text_;
  std::string kind_, path_;
  size_t at_ = 0;
  int64_t line_ = 1, record_line_ = 0;
};

// A CSV file's header row, trimmed, refused when a name appears twice (a name must pick one column).
struct CsvHeader {
  std::vector<std::string> names;
  // The column called `name`, or -1.
  int64_t find(const std::string& name) const;
  // "'a', 'b', 'c'": the columns, for messages (the first 30, and how many more).
  std::string listed() const;
};
CsvHeader read_csv_header(CsvReader& reader, const std::string& kind, const std::string& path);
// Refuses a record whose field count is not the header's, naming the line and both counts.
void check_field_count(const CsvReader& reader, const std::vector<std::string>& fields,
                       const CsvHeader& header);
// "table: a.csv, line 7: column 'price' (number 3) holds 'n/a', which is not a number".
[[noreturn]] void throw_not_a_number(const CsvReader& reader, const CsvHeader& header, size_t column,
                                     std::string_view text);
// "table: a.csv has no column 'price' (the target); its columns are 'a', 'b'". `role` says what the name was
// for; an empty name says that none was given.
[[noreturn]] void throw_no_such_column(const std::string& kind, const std::string& path,
                                       const CsvHeader& header, const std::string& name,
                                       const std::string& role);

}  // namespace gn::nn
