// Reading JSON in dtfrun, through nlohmann/json: a job's state file (`dtfrun status`) and a
// sweep run's metrics. Writing a JSON string is view.hpp's json_string.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace dtfrun {

// One whole JSON document (RFC 8259: no '+1', '01' or '.5'), its objects' members in document
// order. Throws std::runtime_error saying where and what is wrong: "invalid JSON at offset 18
// (line 2, column 1): syntax error while parsing object key - unexpected end of input; ...".
inline nlohmann::ordered_json parse_json(std::string_view text) {
  try {
    return nlohmann::ordered_json::parse(text.begin(), text.end());
  } catch (const nlohmann::ordered_json::parse_error& e) {
    // e.what() is "[json.exception.parse_error.101] parse error at line 2, column 1: why".
    const std::string_view what = e.what();
    const auto at = what.find("at line ");
    const auto colon = what.find(": ", at == std::string_view::npos ? 0 : at);
    if (at == std::string_view::npos || colon == std::string_view::npos) {
      throw std::runtime_error("invalid JSON at offset " + std::to_string(e.byte) + ": " + std::string(what));
    }
    throw std::runtime_error("invalid JSON at offset " + std::to_string(e.byte) + " (" +
                             std::string(what.substr(at + 3, colon - at - 3)) + "): " +
                             std::string(what.substr(colon + 2)));
  } catch (const nlohmann::ordered_json::exception& e) {
    // A number out of range ("[json.exception.out_of_range.406] number overflow parsing ...").
    std::string_view what = e.what();
    if (const auto end = what.find("] "); what.starts_with("[json.exception.") && end != std::string_view::npos) {
      what.remove_prefix(end + 2);
    }
    throw std::runtime_error("invalid JSON: " + std::string(what));
  }
}

}  // namespace dtfrun
