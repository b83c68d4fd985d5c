// Chat formats of the supported models (chat_template.h), recognised from the GGUF's template.
#include "server/chat_template.h"

#include <string_view>

namespace cisa::server {
namespace {

// ChatML templates that open with a fixed system turn when the conversation has none write it as
// a literal: '<|im_start|>system\n<text><|im_end|>'. Returns <text>, or "" when the template has
// no such literal (then no system turn is added).
std::string chatml_default_system(std::string_view tmpl) {
  const std::string_view open = "<|im_start|>system";
  size_t p = tmpl.find(open);
  if (p == std::string_view::npos) return {};
  p += open.size();
  if (tmpl.substr(p, 1) == "\n") {
    p += 1;
  } else if (tmpl.substr(p, 2) == "\\n") {
    p += 2;
  } else {
    return {};
  }
  const size_t end = tmpl.find("<|im_end|>", p);
  if (end == std::string_view::npos) return {};
  const std::string_view text = tmpl.substr(p, end - p);
  // Only a plain literal: an expression (message['content'], concatenation) is not a default.
  if (text.empty() || text.find_first_of("'\"{}+") != std::string_view::npos) return {};
  return std::string(text);
}

}  // namespace

const char* chat_format_name(ChatFormat f) {
  return f == ChatFormat::kGemma3 ? "gemma3" : "chatml";
}

Result<ChatFormat> parse_chat_format(const std::string& name) {
  if (name == "gemma3") return ChatFormat::kGemma3;
  if (name == "chatml") return ChatFormat::kChatMl;
  return invalid_argument("unknown chat template '" + name + "' (gemma3 or chatml)");
}

Result<ChatTemplate> ChatTemplate::for_model(const GgufFile& file, const Tokenizer& tok,
                                             const std::string& forced) {
  ChatTemplate t;
  std::string_view tmpl;
  if (auto s = file.get_string("tokenizer.chat_template"); s.ok()) tmpl = *s;
  if (!forced.empty()) {
    CISA_ASSIGN_OR_RETURN(t.format_, parse_chat_format(forced));
  } else if (tmpl.empty()) {
    return failed_precondition(
        "this model's GGUF has no chat template (tokenizer.chat_template); use /v1/completions, "
        "or start the server with --chat-template gemma3|chatml");
  } else if (tmpl.find("<start_of_turn>") != std::string_view::npos) {
    t.format_ = ChatFormat::kGemma3;
  } else if (tmpl.find("<|im_start|>") != std::string_view::npos) {
    t.format_ = ChatFormat::kChatMl;
  } else {
    return failed_precondition(
        "this model's chat template is neither Gemma 3 turns nor ChatML, the formats the server "
        "renders; use /v1/completions, or start the server with --chat-template gemma3|chatml");
  }
  if (t.format_ == ChatFormat::kChatMl) t.default_system_ = chatml_default_system(tmpl);
  const char* const markers[2][2] = {{"<start_of_turn>", "<end_of_turn>"},
                                     {"<|im_start|>", "<|im_end|>"}};
  const auto& m = markers[t.format_ == ChatFormat::kGemma3 ? 0 : 1];
  for (const char* marker : m)
    if (tok.find_token(marker) < 0)
      return failed_precondition(std::string("the ") + chat_format_name(t.format_) +
                                 " chat format needs the token " + marker +
                                 ", which this model's vocabulary lacks");
  t.end_of_turn_ = tok.find_token(m[1]);
  return t;
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages) const {
  std::string out;
  if (format_ == ChatFormat::kGemma3) {
    // Gemma 3 has no system role: system text opens the first user turn.
    std::string system;
    bool first_user = true;
    for (const ChatMessage& m : messages) {
      if (m.role == "system") {
        system += (system.empty() ? "" : "\n\n") + m.content;
        continue;
      }
      const bool user = m.role == "user";
      out += "<start_of_turn>";
      out += user ? "user\n" : "model\n";
      if (user && first_user && !system.empty()) out += system + "\n\n";
      if (user) first_user = false;
      out += m.content;
      out += "<end_of_turn>\n";
    }
    // A conversation of system text only: that text is the user's turn.
    if (first_user && !system.empty()) out += "<start_of_turn>user\n" + system + "<end_of_turn>\n";
    out += "<start_of_turn>model\n";
    return out;
  }
  if (!default_system_.empty() && (messages.empty() || messages.front().role != "system"))
    out += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
  for (const ChatMessage& m : messages)
    out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace cisa::server
