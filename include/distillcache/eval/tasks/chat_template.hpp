#pragma once
// The model's chat template, as far as the tasks need it: the text around one user turn and the
// start of the assistant's reply. Read from the GGUF key tokenizer.chat_template (a Jinja
// program) and recognised rather than interpreted: ChatML, which SmolLM2 uses,
//
//   [<|im_start|>system\n{default system}<|im_end|>\n]<|im_start|>user\n{user}<|im_end|>\n
//   <|im_start|>assistant\n{answer prefix}
//
// including the default system turn a template adds when the conversation has none (SmolLM2's
// "You are a helpful AI assistant named SmolLM, ..."), as Hugging Face's apply_chat_template
// would render it. "none" is the raw prompt (user text, then the answer prefix), RULER's "base"
// template. Any other template is an error naming the choices: rendering it wrongly would
// measure the template, not the cache.
#include <string>
#include <string_view>

#include "../../core/error.hpp"
#include "../../io/gguf.hpp"

namespace dc::tasks {

enum class ChatFormat { none, chatml };

struct ChatTemplate {
  ChatFormat format = ChatFormat::none;
  std::string default_system;  // chatml: the system turn added when there is none; "" = none

  // Everything before the user's text.
  std::string user_prefix() const {
    if (format == ChatFormat::none) return {};
    std::string s;
    if (!default_system.empty()) s += "<|im_start|>system\n" + default_system + "<|im_end|>\n";
    return s + "<|im_start|>user\n";
  }
  // Between the user's text and the assistant's first words. RULER's answer prefixes start with
  // a space (they follow the question on the same line); at the start of a ChatML reply that
  // space is dropped.
  std::string assistant_start(std::string_view answer_prefix) const {
    if (format == ChatFormat::none) return std::string(answer_prefix);
    if (!answer_prefix.empty() && answer_prefix.front() == ' ') answer_prefix.remove_prefix(1);
    return "<|im_end|>\n<|im_start|>assistant\n" + std::string(answer_prefix);
  }
  const char* name() const { return format == ChatFormat::chatml ? "chatml" : "none"; }

  // Recognises a Jinja chat template.
  static ChatTemplate from_jinja(std::string_view jinja) {
    DC_CHECK(!jinja.empty(), "chat template: the model's tokenizer.chat_template is empty; pass "
             "--chat-template none for raw prompts");
    const bool chatml = jinja.find("<|im_start|>") != std::string_view::npos &&
                        jinja.find("<|im_end|>") != std::string_view::npos &&
                        jinja.find("<|im_start|>assistant") != std::string_view::npos;
    DC_CHECK(chatml, "chat template not supported: only ChatML (<|im_start|>role ... <|im_end|>) is "
             "recognised; pass --chat-template none for raw prompts (template starts: '",
             jinja.substr(0, 60), "')");
    ChatTemplate t;
    t.format = ChatFormat::chatml;
    // A literal system turn written by the template itself (not from a message) is its default.
    constexpr std::string_view open = "<|im_start|>system\n";
    if (const auto at = jinja.find(open); at != std::string_view::npos) {
      const auto begin = at + open.size();
      const auto end = jinja.find("<|im_end|>", begin);
      if (end != std::string_view::npos) {
        const std::string_view text = jinja.substr(begin, end - begin);
        // Template code inside (a message's content, a variable) means it is not a literal.
        if (text.find_first_of("{}'+") == std::string_view::npos) t.default_system = std::string(text);
      }
    }
    return t;
  }

  // "auto" reads the model's template; "chatml" and "none" force one.
  static ChatTemplate from_choice(std::string_view choice, const GgufFile& file) {
    if (choice == "none") return {};
    if (choice == "auto") {
      DC_CHECK(file.has("tokenizer.chat_template"), "chat template: gguf '", file.path().string(),
               "' has no tokenizer.chat_template; pass --chat-template none for raw prompts");
      return from_jinja(file.get_string("tokenizer.chat_template"));
    }
    DC_CHECK(choice == "chatml", "unknown chat template '", choice, "' (known: auto, chatml, none)");
    ChatTemplate t;
    t.format = ChatFormat::chatml;
    return t;
  }
};

}  // namespace dc::tasks
