#include "data/chat_template.h"

#include <array>
#include <utility>

namespace q4t::chat {

namespace {

constexpr std::array<std::pair<Template, const char*>, 7> kNames = {{
    {Template::chatml, "chatml"}, {Template::llama3, "llama3"}, {Template::llama2, "llama2"},
    {Template::mistral, "mistral"}, {Template::zephyr, "zephyr"}, {Template::gemma, "gemma"},
    {Template::phi3, "phi3"},
}};

// Python's str.strip() / Jinja's trim on ASCII whitespace.
std::string trim(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

bool has(const std::string& s, const char* needle) { return s.find(needle) != std::string::npos; }

// Appends to the last segment when it has the same kind, so the output stays short and readable.
void emit(std::vector<Segment>& out, std::string text, bool assistant) {
  if (text.empty()) return;
  if (!out.empty() && out.back().assistant == assistant) {
    out.back().text += text;
  } else {
    out.push_back({std::move(text), assistant});
  }
}

// Families without a system role: the system prompt goes before the first user message.
std::vector<Message> fold_system(const std::vector<Message>& msgs) {
  if (msgs.empty() || msgs[0].role != "system") return msgs;
  std::vector<Message> out(msgs.begin() + 1, msgs.end());
  if (!out.empty()) out[0].content = msgs[0].content + "\n\n" + out[0].content;
  return out;
}

// Role header, content, end marker, separator: the shape of chatml, llama3, gemma, phi3 and zephyr.
struct TurnShape {
  std::string head, end, sep;
};

void render_turns(std::vector<Segment>& out, const std::vector<Message>& msgs, bool trim_content,
                  TurnShape (*shape)(const std::string& role)) {
  for (const Message& m : msgs) {
    TurnShape s = shape(m.role);
    bool a = m.role == "assistant";
    emit(out, s.head, false);
    emit(out, (trim_content ? trim(m.content) : m.content) + s.end, a);
    emit(out, s.sep, false);
  }
}

std::vector<Segment> render_llama2(const std::vector<Message>& msgs, const std::string& bos, const std::string& eos) {
  std::vector<Segment> out;
  std::string system;
  size_t first = 0;
  if (!msgs.empty() && msgs[0].role == "system") {
    system = msgs[0].content;
    first = 1;
  }
  for (size_t i = first; i < msgs.size(); ++i) {
    const Message& m = msgs[i];
    if (m.role == "user") {
      std::string content = m.content;
      if (i == first && first == 1) content = "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content;
      emit(out, bos + "[INST] " + trim(content) + " [/INST]", false);
    } else {
      emit(out, " ", false);
      emit(out, trim(m.content) + " " + eos, true);
    }
  }
  return out;
}

std::vector<Segment> render_mistral(const std::vector<Message>& msgs, const std::string& bos, const std::string& eos) {
  std::vector<Segment> out;
  emit(out, bos, false);
  for (const Message& m : fold_system(msgs)) {
    if (m.role == "user") {
      emit(out, "[INST] " + m.content + " [/INST]", false);
    } else {
      emit(out, m.content + eos, true);
    }
  }
  return out;
}

}  // namespace

std::string known_template_names() {
  std::string s;
  for (const auto& [t, name] : kNames) s += (s.empty() ? "" : ", ") + std::string(name);
  return s;
}

const char* template_name(Template t) {
  for (const auto& [tt, name] : kNames) {
    if (tt == t) return name;
  }
  return "?";
}

Template template_by_name(const std::string& name) {
  for (const auto& [t, n] : kNames) {
    if (name == n) return t;
  }
  throw TemplateError("unknown chat template '" + name + "'; known: " + known_template_names());
}

Template detect_template(const std::string& j) {
  if (has(j, "<|im_start|>")) return Template::chatml;
  if (has(j, "<|start_header_id|>")) return Template::llama3;
  if (has(j, "<start_of_turn>")) return Template::gemma;
  if (has(j, "<|end|>") && has(j, "<|assistant|>")) return Template::phi3;
  if (has(j, "<|user|>") && has(j, "<|assistant|>")) return Template::zephyr;
  if (has(j, "[INST]") && has(j, "<<SYS>>")) return Template::llama2;
  if (has(j, "[INST]")) return Template::mistral;
  throw TemplateError(std::string(j.empty() ? "the model has no tokenizer.chat_template"
                                            : "the model's tokenizer.chat_template is not one we recognise") +
                      "; choose one of: " + known_template_names());
}

void check_conversation(Template t, const std::vector<Message>& msgs) {
  if (msgs.empty()) throw TemplateError("'messages' is empty");
  for (size_t i = 0; i < msgs.size(); ++i) {
    const std::string& r = msgs[i].role;
    if (r != "system" && r != "user" && r != "assistant") {
      throw TemplateError("message " + std::to_string(i) + " has role '" + r +
                          "'; expected system, user or assistant");
    }
    if (r == "system" && i != 0) {
      throw TemplateError("message " + std::to_string(i) + " is a system message; only the first may be");
    }
  }
  if (t != Template::llama2 && t != Template::mistral && t != Template::gemma) return;
  size_t first = msgs[0].role == "system" ? 1 : 0;
  for (size_t i = first; i < msgs.size(); ++i) {
    const char* want = (i - first) % 2 == 0 ? "user" : "assistant";
    if (msgs[i].role != want) {
      throw TemplateError("the " + std::string(template_name(t)) +
                          " template needs user and assistant turns alternating, starting with user; message " +
                          std::to_string(i) + " is '" + msgs[i].role + "'");
    }
  }
}

std::vector<Segment> render(Template t, const std::vector<Message>& msgs, const std::string& bos,
                            const std::string& eos) {
  std::vector<Segment> out;
  switch (t) {
    case Template::chatml:
      render_turns(out, msgs, false, [](const std::string& r) {
        return TurnShape{"<|im_start|>" + r + "\n", "<|im_end|>", "\n"};
      });
      return out;
    case Template::llama3:
      emit(out, bos, false);
      render_turns(out, msgs, true, [](const std::string& r) {
        return TurnShape{"<|start_header_id|>" + r + "<|end_header_id|>\n\n", "<|eot_id|>", ""};
      });
      return out;
    case Template::gemma:
      emit(out, bos, false);
      render_turns(out, fold_system(msgs), true, [](const std::string& r) {
        return TurnShape{"<start_of_turn>" + std::string(r == "assistant" ? "model" : r) + "\n", "<end_of_turn>",
                         "\n"};
      });
      return out;
    case Template::phi3:
      render_turns(out, msgs, false,
                   [](const std::string& r) { return TurnShape{"<|" + r + "|>\n", "<|end|>", "\n"}; });
      return out;
    case Template::zephyr: {
      for (const Message& m : msgs) {
        emit(out, "<|" + m.role + "|>\n", false);
        emit(out, m.content + eos, m.role == "assistant");
        emit(out, "\n", false);
      }
      return out;
    }
    case Template::llama2:
      return render_llama2(msgs, bos, eos);
    case Template::mistral:
      return render_mistral(msgs, bos, eos);
  }
  return out;
}

std::string generation_prompt(Template t, const std::vector<Message>& msgs, const std::string& bos,
                              const std::string& eos) {
  std::string text;
  for (const Segment& s : render(t, msgs, bos, eos)) text += s.text;
  switch (t) {
    case Template::chatml:
      return text + "<|im_start|>assistant\n";
    case Template::llama3:
      return text + "<|start_header_id|>assistant<|end_header_id|>\n\n";
    case Template::gemma:
      return text + "<start_of_turn>model\n";
    case Template::phi3:
    case Template::zephyr:
      return text + "<|assistant|>\n";
    case Template::llama2:
    case Template::mistral:
      return text;  // the user turn ends with [/INST]; the answer follows it
  }
  return text;
}

std::string turn_end(Template t, const std::string& eos) {
  switch (t) {
    case Template::chatml:
      return "<|im_end|>";
    case Template::llama3:
      return "<|eot_id|>";
    case Template::gemma:
      return "<end_of_turn>";
    case Template::phi3:
      return "<|end|>";
    case Template::zephyr:
    case Template::llama2:
    case Template::mistral:
      return eos;
  }
  return eos;
}

}  // namespace q4t::chat
