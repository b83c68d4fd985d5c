// server/chat_template.h — turning OpenAI chat messages into a prompt, for the chat formats of the
// supported models. A GGUF's `tokenizer.chat_template` is Jinja; rather than run Jinja, the server
// recognises the two formats it supports by their markers and renders them in C++:
//  - Gemma 3 turns: "<start_of_turn>user\n…<end_of_turn>\n<start_of_turn>model\n" (BOS from the
//    tokenizer; a system message is put before the first user message; "assistant" is "model").
//  - ChatML (SmolLM2): "<|im_start|>role\n…<|im_end|>\n", ending "<|im_start|>assistant\n"; the
//    template's default system message is used when the conversation has none.
//
//   auto t = cisa::server::ChatTemplate::for_model(model.file(), model.tokenizer(), "");
//   if (!t.ok()) ...  // the model has no chat template the server can render: 400 on chat routes
//   std::string prompt = t->render({{"user", "Hello"}});
//   std::vector<int32_t> ids = model.tokenizer().encode(prompt, true, /*parse_special=*/true);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cisa/core/status.h"
#include "cisa/model/gguf.h"
#include "cisa/model/tokenizer.h"

namespace cisa::server {

enum class ChatFormat { kGemma3, kChatMl };
const char* chat_format_name(ChatFormat f);  // "gemma3", "chatml"
Result<ChatFormat> parse_chat_format(const std::string& name);

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant" (checked by the request parser)
  std::string content;
};

class ChatTemplate {
 public:
  // `forced`: "" to recognise the file's tokenizer.chat_template, or a format name to use that
  // format whatever the file says (e.g. Gemma 3 base GGUFs, which carry no template). Errors
  // (kFailedPrecondition) say why no template applies; the format's turn markers must be single
  // tokens of the vocabulary.
  static Result<ChatTemplate> for_model(const GgufFile& file, const Tokenizer& tok,
                                        const std::string& forced);

  ChatFormat format() const { return format_; }
  // The prompt text (special markers included; encode with parse_special), ending with the
  // opening of the assistant's turn.
  std::string render(const std::vector<ChatMessage>& messages) const;
  // The token that ends an assistant turn ("<end_of_turn>", "<|im_end|>"): a stop token of chat
  // requests.
  int32_t end_of_turn() const { return end_of_turn_; }

 private:
  ChatFormat format_ = ChatFormat::kChatMl;
  std::string default_system_;  // ChatML: the template's system message when none is given
  int32_t end_of_turn_ = -1;
};

}  // namespace cisa::server
