// Current Stan's syntax in Stan 2.21's words, line for line (stan_build.hpp translate_stan_syntax).
#include <fmt/format.h>

#include <cctype>
#include <regex>
#include <string>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/process/stan_build.hpp"

namespace nmcmc {

namespace {

bool ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

/// The end (one past) of the bracketed group that opens at text[i] ('[' or '<'), or npos.
size_t balanced_end(const std::string& text, size_t i) {
  const char open = text[i], close = open == '[' ? ']' : '>';
  int depth = 0;
  for (size_t k = i; k < text.size(); ++k) {
    if (text[k] == open) ++depth;
    else if (text[k] == close && --depth == 0) return k + 1;
    else if (text[k] == ';' || text[k] == '{' || text[k] == '}') return std::string::npos;
  }
  return std::string::npos;
}

size_t skip_space(const std::string& text, size_t i) {
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  return i;
}

int line_of(const std::string& text, size_t pos) {
  int line = 1;
  for (size_t k = 0; k < pos && k < text.size(); ++k) line += text[k] == '\n';
  return line;
}

/// `array[dims] TYPE name` at text[i] (i at "array"): the rewritten text and the end of what it
/// replaces, or {"", npos} if this is not such a declaration.
std::pair<std::string, size_t> rewrite_array(const std::string& text, size_t i) {
  size_t k = skip_space(text, i + 5);
  if (k >= text.size() || text[k] != '[') return {"", std::string::npos};
  const size_t dims_end = balanced_end(text, k);
  if (dims_end == std::string::npos) return {"", std::string::npos};
  const std::string dims = text.substr(k + 1, dims_end - k - 2);
  size_t t = skip_space(text, dims_end);
  const size_t type_start = t;
  while (t < text.size() && ident_char(text[t])) ++t;
  if (t == type_start) return {"", std::string::npos};
  // A nested array type (array[N] array[M] real) is one array with both sizes in 2.21.
  if (text.compare(type_start, t - type_start, "array") == 0) {
    auto inner = rewrite_array(text, type_start);
    if (inner.second == std::string::npos) return inner;
    // inner.first is "TYPE name[inner]" or "TYPE[inner]": the outer sizes go first in its last brackets.
    std::string r = inner.first;
    const size_t last_open = r.rfind('[');
    if (last_open == std::string::npos) return {"", std::string::npos};
    const bool outer_unsized = dims.find_first_not_of(" \t,") == std::string::npos;
    r.insert(last_open + 1, outer_unsized ? dims + "," : dims + ", ");
    return {r, inner.second};
  }
  if (t < text.size() && text[t] == '<') {
    const size_t e = balanced_end(text, t);
    if (e == std::string::npos) return {"", std::string::npos};
    t = e;
  }
  size_t type_end = t;
  size_t after = skip_space(text, t);
  if (after < text.size() && text[after] == '[') {  // vector[K], matrix[M, N], vector<lower=0>[K]
    const size_t e = balanced_end(text, after);
    if (e == std::string::npos) return {"", std::string::npos};
    type_end = e;
  }
  const std::string type = text.substr(type_start, type_end - type_start);
  const bool unsized = dims.find_first_not_of(" \t,") == std::string::npos;
  if (unsized) return {type + "[" + dims + "]", type_end};  // a function's argument or return type
  size_t n = skip_space(text, type_end);
  const size_t name_start = n;
  while (n < text.size() && ident_char(text[n])) ++n;
  if (n == name_start) return {"", std::string::npos};
  const std::string gap = text.substr(type_end, name_start - type_end);
  return {type + gap + text.substr(name_start, n - name_start) + "[" + dims + "]", n};
}

}  // namespace

std::string translate_stan_syntax(const std::string& program, const std::string& file_label) {
  std::string out;
  out.reserve(program.size());
  size_t i = 0;
  while (i < program.size()) {
    const char c = program[i];
    // Comments and strings pass through untouched.
    if (c == '/' && i + 1 < program.size() && program[i + 1] == '/') {
      const size_t e = program.find('\n', i);
      const size_t end = e == std::string::npos ? program.size() : e;
      out += program.substr(i, end - i);
      i = end;
      continue;
    }
    if (c == '/' && i + 1 < program.size() && program[i + 1] == '*') {
      const size_t e = program.find("*/", i + 2);
      const size_t end = e == std::string::npos ? program.size() : e + 2;
      out += program.substr(i, end - i);
      i = end;
      continue;
    }
    if (c == '"') {
      const size_t e = program.find('"', i + 1);
      const size_t end = e == std::string::npos ? program.size() : e + 1;
      out += program.substr(i, end - i);
      i = end;
      continue;
    }
    const bool word_start = ident_char(c) && (i == 0 || !ident_char(program[i - 1]));
    if (word_start) {
      size_t e = i;
      while (e < program.size() && ident_char(program[e])) ++e;
      const std::string word = program.substr(i, e - i);
      if (word == "array") {
        auto [text, end] = rewrite_array(program, i);
        if (end != std::string::npos) {
          const std::string span = program.substr(i, end - i);
          out += text;
          // keep the line count: a declaration spread over lines keeps its line breaks
          for (char s : span) {
            if (s == '\n') out += '\n';
          }
          i = end;
          continue;
        }
      }
      if (word == "tuple" || word == "complex" || word == "complex_vector" || word == "complex_row_vector" ||
          word == "complex_matrix" || word == "jacobian") {
        const size_t next = skip_space(program, e);
        const bool used = word == "jacobian" ? program.compare(next, 2, "+=") == 0
                          : word == "tuple"  ? next < program.size() && program[next] == '('
                                             : true;
        if (used) {
          throw DataError(fmt::format("stan: {} line {}: '{}' is newer than Stan 2.21, which nmcmc compiles with; "
                                      "write the program without it",
                                      file_label, line_of(program, i), word));
        }
      }
      if (word == "profile") {  // profile("name") { ... } -> { ... }
        std::smatch m;
        const std::string rest = program.substr(e, 200);
        if (std::regex_search(rest, m, std::regex(R"(^\s*\(\s*"[^"]*"\s*\))"))) {
          i = e + m.length(0);
          continue;
        }
      }
      if (word.size() > 6 && (word.compare(word.size() - 6, 6, "_lupdf") == 0 || word.compare(word.size() - 6, 6, "_lupmf") == 0)) {
        out += word.substr(0, word.size() - 4) + "p" + word.substr(word.size() - 2);
        i = e;
        continue;
      }
      out += word;
      i = e;
      continue;
    }
    if (c == '%' && program.compare(i, 3, "%/%") == 0) {
      out += "/";
      i += 3;
      continue;
    }
    out += c;
    ++i;
  }
  return out;
}

}  // namespace nmcmc
