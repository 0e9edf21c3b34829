// Chat templates, as our own renderers of the text that each family's Jinja template (tokenizer.chat_template)
// produces for a whole conversation (no generation prompt). Each renderer returns the text as segments that
// know whether they belong to an assistant turn, so the dataset can count exactly the assistant's tokens in
// the loss: the assistant content plus the turn's end marker (so the model learns to stop), never the role
// header or the whitespace between turns.
//
// Families and what decides them when the name comes from the GGUF's template (first match wins):
//   chatml  "<|im_start|>"               <|im_start|>{role}\n{content}<|im_end|>\n
//   llama3  "<|start_header_id|>"        {bos}<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>
//   gemma   "<start_of_turn>"            {bos}<start_of_turn>{user|model}\n{content}<end_of_turn>\n
//   phi3    "<|end|>" + "<|assistant|>"  <|{role}|>\n{content}<|end|>\n
//   zephyr  "<|user|>" + "<|assistant|>" <|{role}|>\n{content}{eos}\n
//   llama2  "[INST]" + "<<SYS>>"         {bos}[INST] <<SYS>>\n{sys}\n<</SYS>>\n\n{user} [/INST] {asst} {eos}
//   mistral "[INST]"                     {bos}[INST] {user} [/INST]{asst}{eos}
// Content is trimmed of surrounding whitespace where the reference template trims it (llama2, llama3, gemma).
// Templates without a system role (gemma, mistral) put the system prompt before the first user message,
// separated by "\n\n", as llama.cpp's built-in renderers and the newer templates of those families do.
#pragma once
#include <stdexcept>
#include <string>
#include <vector>

namespace q4t::chat {

enum class Template { chatml, llama3, llama2, mistral, zephyr, gemma, phi3 };

struct Message {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

struct Segment {
  std::string text;
  bool assistant = false;  // counted in the loss by default
};

struct TemplateError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// "chatml, llama3, llama2, mistral, zephyr, gemma, phi3".
std::string known_template_names();
const char* template_name(Template t);
// By name; throws TemplateError listing the known names.
Template template_by_name(const std::string& name);
// By the distinctive substrings of a tokenizer.chat_template (table above); throws TemplateError listing the
// known names when none matches (an empty template included).
Template detect_template(const std::string& jinja);

// Checks the conversation's shape for the family (roles known; a system message only first; families whose
// reference template requires it: user and assistant alternating, starting with user). Throws TemplateError.
void check_conversation(Template t, const std::vector<Message>& msgs);
// Renders the conversation; bos/eos are the tokenizer's BOS/EOS token texts (the templates' bos_token and
// eos_token). The segments concatenate to the full rendered text.
std::vector<Segment> render(Template t, const std::vector<Message>& msgs, const std::string& bos,
                            const std::string& eos);

// The text that asks for the next assistant turn: the conversation (ending with a user message) as render()
// writes it, then the assistant's role header, so the model's continuation is the assistant's content.
std::string generation_prompt(Template t, const std::vector<Message>& msgs, const std::string& bos,
                              const std::string& eos);
// The marker that ends an assistant turn ("<|im_end|>", "<|eot_id|>", ...; eos for the families that end a turn
// with the end-of-sequence token).
std::string turn_end(Template t, const std::string& eos);

}  // namespace q4t::chat
