// A small JSON reader for the files dtfrun reads back: its own state files (`dtfrun status`)
// and the metrics files a sweep's runs write. Whole documents only; errors name the offset.
#pragma once

#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dtfrun {

struct json_value {
  enum class kind { null, boolean, number, string, array, object };
  kind type = kind::null;
  bool boolean = false;
  double number = 0.0;
  std::string text;
  // An array's elements, or an object's member values with their names in `keys` (in
  // document order).
  std::vector<json_value> items;
  std::vector<std::string> keys;

  const json_value* find(std::string_view key) const {
    if (type != kind::object) return nullptr;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (keys[i] == key) return &items[i];
    }
    return nullptr;
  }
  std::optional<double> number_at(std::string_view key) const {
    const json_value* v = find(key);
    if (v == nullptr || v->type != kind::number) return std::nullopt;
    return v->number;
  }
  std::string string_at(std::string_view key) const {
    const json_value* v = find(key);
    return v != nullptr && v->type == kind::string ? v->text : std::string();
  }
};

class json_reader {
 public:
  static json_value parse(std::string_view text) {
    json_reader r(text);
    json_value v = r.value(0);
    r.skip_space();
    if (r.at_ != text.size()) r.fail("trailing characters");
    return v;
  }

 private:
  explicit json_reader(std::string_view text) : text_(text) {}

  static constexpr int max_depth = 64;

  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("invalid JSON at offset " + std::to_string(at_) + ": " + what);
  }
  void skip_space() {
    while (at_ < text_.size() &&
           (text_[at_] == ' ' || text_[at_] == '\n' || text_[at_] == '\t' || text_[at_] == '\r')) {
      ++at_;
    }
  }
  char peek() {
    skip_space();
    if (at_ >= text_.size()) fail("unexpected end");
    return text_[at_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++at_;
  }
  bool literal(std::string_view word) {
    if (text_.substr(at_, word.size()) != word) return false;
    at_ += word.size();
    return true;
  }

  json_value value(int depth) {
    if (depth > max_depth) fail("nested too deeply");
    json_value v;
    const char c = peek();
    if (c == '{') {
      v.type = json_value::kind::object;
      ++at_;
      if (peek() == '}') {
        ++at_;
        return v;
      }
      while (true) {
        if (peek() != '"') fail("expected a member name");
        v.keys.push_back(string());
        expect(':');
        v.items.push_back(value(depth + 1));
        if (peek() == ',') {
          ++at_;
          continue;
        }
        expect('}');
        return v;
      }
    }
    if (c == '[') {
      v.type = json_value::kind::array;
      ++at_;
      if (peek() == ']') {
        ++at_;
        return v;
      }
      while (true) {
        v.items.push_back(value(depth + 1));
        if (peek() == ',') {
          ++at_;
          continue;
        }
        expect(']');
        return v;
      }
    }
    if (c == '"') {
      v.type = json_value::kind::string;
      v.text = string();
      return v;
    }
    if (literal("true")) {
      v.type = json_value::kind::boolean;
      v.boolean = true;
      return v;
    }
    if (literal("false")) {
      v.type = json_value::kind::boolean;
      return v;
    }
    if (literal("null")) return v;
    return number();
  }

  json_value number() {
    const std::size_t start = at_;
    while (at_ < text_.size() && std::string_view("+-0123456789.eE").find(text_[at_]) !=
                                     std::string_view::npos) {
      ++at_;
    }
    const std::string digits(text_.substr(start, at_ - start));
    char* end = nullptr;
    json_value v;
    v.type = json_value::kind::number;
    v.number = digits.empty() ? 0.0 : std::strtod(digits.c_str(), &end);
    if (digits.empty() || end != digits.c_str() + digits.size()) {
      at_ = start;
      fail("expected a value");
    }
    return v;
  }

  std::string string() {
    ++at_;  // the opening quote
    std::string out;
    while (true) {
      if (at_ >= text_.size()) fail("unterminated string");
      const char c = text_[at_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_ >= text_.size()) fail("unterminated string");
      const char e = text_[at_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          if (at_ + 4 > text_.size()) fail("short \\u escape");
          unsigned code = 0;
          for (int i = 0; i < 4; ++i) {
            const char h = text_[at_++];
            code <<= 4;
            if (h >= '0' && h <= '9') code |= unsigned(h - '0');
            else if (h >= 'a' && h <= 'f') code |= unsigned(h - 'a' + 10);
            else if (h >= 'A' && h <= 'F') code |= unsigned(h - 'A' + 10);
            else fail("bad \\u escape");
          }
          // UTF-8 of the code unit (surrogate pairs are not joined: dtfrun writes none).
          if (code < 0x80) {
            out += char(code);
          } else if (code < 0x800) {
            out += char(0xC0 | (code >> 6));
            out += char(0x80 | (code & 0x3F));
          } else {
            out += char(0xE0 | (code >> 12));
            out += char(0x80 | ((code >> 6) & 0x3F));
            out += char(0x80 | (code & 0x3F));
          }
          break;
        }
        default: fail("bad escape");
      }
    }
  }

  std::string_view text_;
  std::size_t at_ = 0;
};

}  // namespace dtfrun
