// wm_llm: generate or chat with a decoder loaded from a Hugging Face model folder.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "llmkv/beam.h"
#include "llmkv/chat_template.h"
#include "llmkv/chunk_cache.h"
#include "llmkv/session_store.h"
#include "llmkv/config.h"
#include "llmkv/hf_folder.h"
#include "llmkv/model_source.h"
#include "llmkv/perplexity.h"
#include "llmkv/session.h"
#include "llmkv/tokenizer.h"
#include "llmkv/weight_shapes.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "tools/cli/cleanup.h"
#include "tools/cli/distinct_outputs.h"
#include "tools/cli/error_text.h"
#include "tools/cli/kv_store_options.h"
#include "tools/cli/npy.h"
#include "tools/cli/output_file.h"
#include "tools/cli/progress.h"
#include "tools/cli/shipped_path.h"
#include "tools/cli/validators.h"

// Each program's code is in a namespace of its own: wm_tools, the one binary of the programs,
// compiles several of them in one unit (tools/README.md, "Building").
namespace wm_tool_llm {

namespace {

const char* const kEmbeddedModel = "assets/models/tiny-llm";

// At most max_bytes of a stream, where `what` names it in the error: a prompt larger than that
// (or a device that never ends, /dev/zero) is refused instead of read until memory runs out.
std::string read_bounded(std::istream& in, int64_t max_bytes, const std::string& what) {
  std::string text;
  char buf[1 << 16];
  while (in) {
    in.read(buf, sizeof buf);
    text.append(buf, static_cast<size_t>(in.gcount()));
    if (static_cast<int64_t>(text.size()) > max_bytes)
      throw wm::Error(wm::str_cat(what, " holds more than --max-prompt-bytes ", max_bytes,
                                  " bytes: give a shorter prompt or raise the limit"));
  }
  if (in.bad()) throw wm::Error(wm::str_cat("cannot read ", what));
  return text;
}

std::string read_prompt_file(const std::string& path, int64_t max_bytes) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw wm::Error(wm::str_cat("--prompt-file ", path, " is a folder, not a file"));
  std::ifstream f(path, std::ios::binary);
  if (!f)
    throw wm::Error(wm::str_cat("--prompt-file: cannot read ", path,
                                std::filesystem::exists(path, ec) ? " (no permission?)" : " (no such file)"));
  return read_bounded(f, max_bytes, wm::str_cat("the prompt file ", path));
}

// A line of standard input (chat), at most max_bytes long. False at the end of input.
bool read_line_bounded(std::string& line, int64_t max_bytes) {
  line.clear();
  for (int c; (c = std::cin.get()) != EOF;) {
    if (c == '\n') return true;
    line.push_back(static_cast<char>(c));
    if (static_cast<int64_t>(line.size()) > max_bytes)
      throw wm::Error(wm::str_cat("a chat line on standard input holds more than --max-prompt-bytes ", max_bytes,
                                  " bytes"));
  }
  return !line.empty();
}

// Writes to standard output; a reader that went away (EPIPE, when SIGPIPE is ignored) ends the
// run as an error instead of generating on for no one.
void write_stdout(const char* data, size_t n) {
  if ((n > 0 && std::fwrite(data, 1, n, stdout) != n) || std::fflush(stdout) != 0)
    throw wm::Error(wm::str_cat("cannot write to standard output: ", std::strerror(errno)));
}

void print_stats(const wm::llm::GenerationStats& s) {
  std::fprintf(stderr,
               "wm_llm: prompt %lld tokens, prefill %.1f tokens/s, TTFT %.1f ms; %lld new tokens, decode %.1f tokens/s; "
               "KV %.2f MiB used (%.2f MiB allocated), %lld tokens per layer (peak %lld)\n",
               static_cast<long long>(s.prompt_tokens), s.prefill_tokens_per_s(), 1000.0 * s.ttft_s,
               static_cast<long long>(s.new_tokens), s.decode_tokens_per_s(), s.kv_bytes_used / 1048576.0,
               s.kv_bytes_allocated / 1048576.0, static_cast<long long>(s.kv_tokens),
               static_cast<long long>(s.kv_tokens_peak));
}

nlohmann::json stats_json(const wm::llm::GenerationStats& s) {
  return {{"prompt_tokens", s.prompt_tokens},
          {"new_tokens", s.new_tokens},
          {"prefill_s", s.prefill_s},
          {"prefill_tokens_per_s", s.prefill_tokens_per_s()},
          {"ttft_s", s.ttft_s},
          {"decode_s", s.decode_s},
          {"decode_tokens_per_s", s.decode_tokens_per_s()},
          {"kv_bytes_used", s.kv_bytes_used},
          {"kv_bytes_allocated", s.kv_bytes_allocated},
          {"kv_tokens", s.kv_tokens},
          {"kv_tokens_peak", s.kv_tokens_peak}};
}

// The command line. The *_given flags tell an option given empty (an error) from one left out.
struct Options {
  std::string model_dir = kEmbeddedModel;
  std::string prompt, prompt_file, system, dump_logits, stats_json_path, device = "auto", dtype = "float32";
  std::string kv_dtype, weights = "float";  // --kv-dtype (empty: --dtype), --weights
  std::string quant_activations = "q8";
  std::string chat_template;  // --chat-template: a built-in name; empty: the model's own
  bool weights_given = false;
  bool chat = false, no_stream = false, raw_special = false, strict_positions = false;
  int64_t max_prompt_bytes = int64_t{256} << 10;  // ~64k tokens of English text
  wm::llm::GenerateOptions gen;
  std::vector<int64_t> stop_tokens;
  int beams = 0, threads = 0;
  double length_penalty = 1.0;
  int64_t prefill_chunk = 512;
  wm::llm::TextMemoryConfig memory;
  std::string session;  // --session: the conversation's name in the kv store
  bool session_reset = false;
  std::string perplexity_file;       // --perplexity: score this text instead of generating
  int64_t perplexity_window = 1024, perplexity_windows = 0;
  wm::cli::KvStoreOptions kv_store;
  bool model_given = false, prompt_given = false, prompt_file_given = false, budget_given = false;
};

// Sampling, stopping, beams and the prefill's chunk.
void add_generation_options(CLI::App& app, Options& o) {
  app.add_option("-n,--max-new-tokens", o.gen.max_new_tokens, "tokens to generate at most")
      ->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("-t,--temperature", o.gen.sampling.temperature, "0: greedy")
      ->capture_default_str()->check(wm::cli::FiniteRange(0.0, 100.0));
  app.add_option("--top-k", o.gen.sampling.top_k, "keep the k most probable tokens (0: all)")
      ->capture_default_str()->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  app.add_option("--top-p", o.gen.sampling.top_p, "nucleus mass in (0, 1]")
      ->capture_default_str()->check(wm::cli::FiniteRange(0.0, 1.0));
  app.add_option("--seed", o.gen.sampling.seed, "sampling seed")->capture_default_str()->check(wm::cli::Uint64());
  app.add_option("--stop", o.gen.stop_strings, "stop string (repeatable)");
  app.add_option("--stop-token", o.stop_tokens, "stop token id (repeatable; the model's end tokens always stop)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 31));
  app.add_option("--beams", o.beams, "beam search with this many beams (0: sample)")->check(CLI::Range(0, 64));
  app.add_option("--length-penalty", o.length_penalty, "beam ranking: score / length^penalty")
      ->check(wm::cli::FiniteRange(-10.0, 10.0));
  app.add_option("--prefill-chunk", o.prefill_chunk, "prompt tokens per forward pass")
      ->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
}

// The memory policy; returns --kv-budget's option (given or not matters).
CLI::Option* add_memory_options(CLI::App& app, Options& o) {
  app.add_option("--policy", o.memory.policy, "KV memory policy")
      ->capture_default_str()
      ->check(CLI::IsMember(wm::llm::text_policy_names()));
  CLI::Option* budget_opt =
      app.add_option("--kv-budget", o.memory.budget, "KV tokens per layer the policy keeps (needed by all but full)")
          ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app.add_option("--sink", o.memory.sink, "streaming_llm: attention-sink tokens")->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("--window", o.memory.window, "snapkv, pyramidkv, adakv: observation window (last prompt queries)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--adakv-floor", o.memory.adakv_floor,
                 "adakv: each kv head keeps at least this share of an even split of its layer's budget")
      ->capture_default_str()
      ->check(wm::cli::FiniteRange(0.0, 1.0));
  app.add_flag("!--no-prompt-restart", o.memory.prompt_restart,
               "keepkv: a prompt step adds its attention to the scores' moving average instead of restarting them");
  app.add_option("--score-kernel", o.memory.score_kernel,
                 "keepkv: max-pooling width over its scores before choosing what to keep (odd; 1: none, KeepKV as "
                 "published)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 10));
  app.add_option("--score-window", o.memory.score_window,
                 "keepkv: each step's attention scores from its last N queries (0: from all of them)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  return budget_opt;
}

// --perplexity, the outputs, the device and the numbers' types.
void add_run_options(CLI::App& app, Options& o) {
  app.add_option("--perplexity", o.perplexity_file,
                 "score this text file instead of generating: its perplexity in windows of --perplexity-window tokens, "
                 "each run afresh, every token after a window's first scored (the tail short of a window is left out)");
  app.add_option("--perplexity-window", o.perplexity_window, "tokens a --perplexity window holds")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
  app.add_option("--perplexity-windows", o.perplexity_windows, "score the first N windows only (0: all)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--dump-logits", o.dump_logits, "write the logits at the prompt's last position to this .npy file");
  app.add_option("--stats-json", o.stats_json_path, "write timing and KV figures as JSON to this file");
  app.add_flag("--no-stream", o.no_stream, "print the text at the end instead of as it is generated");
  app.add_flag("--parse-special", o.raw_special, "match special tokens (e.g. <|im_start|>) in the prompt text");
  app.add_option("--device", o.device, "auto, cpu, cuda, cuda:N")->capture_default_str();
  app.add_option("--dtype", o.dtype, "float32, float16, bfloat16")->capture_default_str();
  app.add_option("--kv-dtype", o.kv_dtype, "K/V cache dtype: float32, bfloat16, float16 (default: --dtype)")
      ->check(CLI::IsMember({"float32", "bfloat16", "float16"}));
  app.add_option("--weights", o.weights,
                 "float: the projections in --dtype; int8: quantised at load, a float32 scale per 32 inputs (CPU); "
                 "stored: a GGUF file's quantized blocks as they are (CPU, float32; the default for GGUF files)")
      ->capture_default_str()
      ->check(CLI::IsMember({"float", "int8", "stored"}));
  app.add_option("--quant-activations", o.quant_activations,
                 "stored weights: q8 rounds the activations to 8 bits before each product, as llama.cpp does; "
                 "float multiplies the blocks by them as they are")
      ->capture_default_str()
      ->check(CLI::IsMember({"q8", "float"}));
  app.add_option("--threads", o.threads, "CPU threads (0: all cores)")->check(CLI::Range(0, 1024));
}

// Parses the command line into `o`. Returns the exit status when the program ends here (--help,
// a parse error, which CLI11 has printed), nothing when it goes on.
std::optional<int> parse_options(int argc, char** argv, Options& o) {
  CLI::App app{
      "wm_llm: generate or chat with a Llama/Qwen2-family decoder from a Hugging Face model folder\n"
      "(config.json, model.safetensors or sharded shards with model.safetensors.index.json, tokenizer.json)\n"
      "or a GGUF file (llama.cpp's format; tools/get_model.sh smollm2 fetches SmolLM2-135M-Instruct)"};
  auto* m_opt = app.add_option("-m,--model", o.model_dir,
                               "model folder or .gguf file (default: the embedded tiny model, looked for in the working directory, "
                               "then above this program's folder)")
                    ->capture_default_str();
  auto* p_opt = app.add_option("-p,--prompt", o.prompt, "prompt text (else --prompt-file, else standard input)");
  auto* f_opt =
      app.add_option("-f,--prompt-file", o.prompt_file, "read the prompt from this file ('-': standard input)")
      ->excludes(p_opt);
  app.add_option("--max-prompt-bytes", o.max_prompt_bytes,
                 "a prompt file or standard input (or a chat line) longer than this is refused")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app.add_flag("--strict-positions", o.strict_positions,
               "refuse a prompt that reaches beyond the model's trained positions (max_position_embeddings) "
               "instead of warning");
  app.add_flag(
      "--chat", o.chat,
      "chat: wrap prompts in the ChatML template; with no prompt, every line of standard input is a user turn");
  app.add_option("--system", o.system, "system message (chat; with --session, of a new conversation only)");
  app.add_option("--chat-template", o.chat_template,
                 "chat: render turns with this built-in template instead of the model's own (" +
                     [] {
                       std::string names;
                       for (const auto& n : wm::llm::ChatTemplate::builtin_names()) names += (names.empty() ? "" : ", ") + n;
                       return names;
                     }() +
                     "; a model without one gets chatml)");
  app.add_option("--session", o.session,
                 "chat: keep the conversation under this name in --kv-store; a later run (this process or another) "
                 "with the same name goes on from its last turn, its K/V and memory as they were (nothing prefilled "
                 "again but the new message)");
  app.add_flag("--session-reset", o.session_reset,
               "--session: start the conversation afresh (what was saved under the name is replaced)");
  wm::cli::add_kv_store_options(app, o.kv_store, "--session's conversations");
  add_generation_options(app, o);
  CLI::Option* budget_opt = add_memory_options(app, o);
  add_run_options(app, o);
  app.footer("--dump-logits and --stats-json are written whole when the run succeeds, and not at all when it fails.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  o.model_given = m_opt->count() > 0;
  o.prompt_given = p_opt->count() > 0;
  o.prompt_file_given = f_opt->count() > 0;
  o.budget_given = budget_opt->count() > 0;
  o.weights_given = app.count("--weights") > 0;
  return std::nullopt;
}

// The prompt file to read: empty for none or for '-' (standard input).
std::string prompt_path(const Options& o) { return o.prompt_file == "-" ? "" : o.prompt_file; }

// Options given with an empty value, and a budget for the policy that has none. Throws wm::Error.
void check_given_values(const Options& o) {
  if (o.model_given && o.model_dir.empty()) throw wm::Error("--model is empty");
  if (o.prompt_given && o.prompt.empty())
    throw wm::Error("--prompt is empty (give the text, or --prompt-file, or the prompt on standard input)");
  if (o.prompt_file_given && o.prompt_file.empty()) throw wm::Error("--prompt-file is empty");
  if (o.budget_given && o.memory.policy == "full")
    throw wm::Error("--kv-budget applies to a memory policy that evicts: --policy full keeps every token");
  if (!o.session.empty() && !o.chat) throw wm::Error("--session keeps a chat: give --chat");
  if (!o.session.empty() && o.kv_store.url.empty())
    throw wm::Error("--session needs --kv-store URL (where the conversation is kept)");
  if (o.session.empty() && (!o.kv_store.url.empty() || o.session_reset))
    throw wm::Error("--kv-store and --session-reset are for --session NAME");
}

// The embedded tiny model's folder, looked for where find_shipped looks. Throws wm::Error when absent.
std::string find_embedded_model() {
  std::string tried;
  std::string dir = wm::cli::find_shipped(kEmbeddedModel, &tried);
  if (dir.empty())
    throw wm::Error(wm::str_cat("the embedded tiny LLM (", kEmbeddedModel, ") was not found; tried ", tried,
                                ": give --model with a Hugging Face model folder"));
  return dir;
}

// The outputs may name neither one another nor an input. Throws wm::Error.
void check_distinct_outputs(const Options& o) {
  const std::string& m = o.model_dir;
  wm::cli::require_distinct_outputs(
      {{"--dump-logits", o.dump_logits}, {"--stats-json", o.stats_json_path}},
      {{"--prompt-file", prompt_path(o)},
       {"--model", m},
       {"the model's config.json", m + "/config.json"},
       {"the model's tokenizer.json", m + "/tokenizer.json"},
       {"the model's generation_config.json", m + "/generation_config.json"},
       {"the model's model.safetensors", m + "/model.safetensors"},
       {"the model's model.safetensors.index.json", m + "/model.safetensors.index.json"}});
}

// Sampling, stop strings and what beam search does not combine with. Throws wm::Error.
void check_generation_options(const Options& o) {
  const wm::llm::SamplingOptions& s = o.gen.sampling;
  if (!(s.top_p > 0)) throw wm::Error("--top-p must be in (0, 1]: 0 keeps no token");
  s.validate();  // the rest, with a message naming the field
  for (const auto& stop : o.gen.stop_strings)
    if (stop.empty()) throw wm::Error("--stop: an empty stop string would stop at once");
  if (o.beams > 0) {
    if (o.chat) throw wm::Error("--beams searches from one prompt: it does not combine with --chat");
    if (!o.dump_logits.empty()) throw wm::Error("--dump-logits is not available with --beams");
    if (s.temperature != 0.0 || s.top_k != 0 || s.top_p != 1.0)
      throw wm::Error("--beams ranks by log-probability: --temperature, --top-k and --top-p do not apply");
    if (!o.gen.stop_strings.empty()) throw wm::Error("--stop is not available with --beams (use --stop-token)");
  }
}

// A GGUF file's weights: as stored unless --weights float or int8 was asked for.
wm::llm::GgufWeights gguf_weights(const Options& o) {
  wm::llm::set_quant_activations(wm::llm::parse_quant_activations(o.quant_activations));
  return o.weights_given && o.weights != "stored" ? wm::llm::GgufWeights::Float : wm::llm::GgufWeights::Stored;
}

// Outputs opened before the model (a bad path fails before the work), committed together at the end.
struct Outputs {
  std::unique_ptr<wm::cli::OutputFile> logits, stats;
};

Outputs open_outputs(const Options& o) {
  Outputs out;
  if (!o.dump_logits.empty()) out.logits = std::make_unique<wm::cli::OutputFile>(o.dump_logits);
  if (!o.stats_json_path.empty()) out.stats = std::make_unique<wm::cli::OutputFile>(o.stats_json_path);
  return out;
}

// The loaded model, its session and what carries from one turn to the next; prints each turn
// and records it for --stats-json. Throws wm::Error (a bad model folder, stop token or policy).
class Conversation {
 public:
  // dt: the model's dtype; kvdt: the K/V cache's.
  Conversation(const Options& o, at::Device dev, at::ScalarType dt, at::ScalarType kvdt,
               wm::cli::OutputFile* logits_file)
      : o_(o),
        dev_(dev),
        dt_(dt),
        logits_file_(logits_file),
        src_(load_source(o, dev, dt)),
        model_(src_.model),
        tok_(*src_.tokenizer),
        tmpl_(chat_template(o, src_)),
        im_end_(tok_.token_to_id("<|im_end|>")),
        gen_(generate_options()),
        session_(model_, tok_, dev, kvdt, session_options()) {
    // Long prefills show their progress (after 2 s, so that short prompts stay quiet).
    gen_.on_prefill = [this](int64_t done, int64_t total) { show_prefill(done, total); };
    if (!o.session.empty()) resume_session();
  }
  Conversation(const Conversation&) = delete;
  Conversation& operator=(const Conversation&) = delete;

  // --chat-template, else the model's own template, else ChatML. A chat of several turns needs
  // one whose turns are ChatML blocks (the later turns are written as such).
  static wm::llm::ChatTemplate chat_template(const Options& o, const wm::llm::LlmSource& s) {
    wm::llm::ChatTemplate t = !o.chat_template.empty()    ? wm::llm::ChatTemplate::named(o.chat_template)
                              : !s.chat_template.empty() ? wm::llm::ChatTemplate::from_source(s.chat_template, s.bos_token,
                                                                                               s.eos_token)
                                                         : wm::llm::ChatTemplate::named("chatml");
    if (!o.chat) return t;
    const std::vector<wm::llm::ChatMessage> probe = {{"system", "s"}, {"user", "u"}};
    if (t.render(probe, true) != wm::llm::render_chatml(probe, true))
      throw wm::Error(wm::str_cat("--chat: the chat template (", t.name(),
                                  ") does not write ChatML turns, which wm_llm's chat needs for now; give "
                                  "--chat-template chatml to use ChatML with this model"));
    return t;
  }

  // The model folder or GGUF file.
  static wm::llm::LlmSource load_source(const Options& o, at::Device dev, at::ScalarType dt) {
    wm::llm::LlmSource s = wm::llm::open_llm(o.model_dir, dev, dt, gguf_weights(o));
    if (o.weights == "stored" && !s.model->weights_quantized())
      throw wm::Error("--weights stored: the model has no quantized blocks to keep (a GGUF file's, on the CPU in float32)");
    if (o.weights == "int8") s.model->quantize_int8();
    return s;
  }

  // One turn: prompt text -> tokens -> generation (or beams); prints and records it (and, with
  // --session, saves the conversation).
  void run_turn(const std::string& text, bool first) {
    first = first && !resumed_;
    const std::vector<int64_t> ids = encode_turn(text, first);
    if (ids.empty() && session_.next_position() == 0) throw wm::Error("the prompt is empty");
    check_context(ids.size());
    prefill_t0_ = std::chrono::steady_clock::now();
    prefill_shown_ = false;
    if (o_.beams > 0)
      run_beams(ids);
    else
      run_sampling(ids, first);
    if (store_) {
      wm::llm::save_session(session_, *store_, o_.session);
      resumed_ = true;
    }
  }

  const nlohmann::json& turns() const { return turns_; }

 private:
  // --session: the kv store for this model (its namespace: the weights' fingerprint), and the
  // conversation saved under the name unless --session-reset.
  void resume_session() {
    store_ = wm::cli::open_kv_store(o_.kv_store, wm::llm::key_hex(wm::llm::model_fingerprint(*model_)));
    if (o_.session_reset) {
      wm::llm::erase_session(*store_, o_.session);
      std::fprintf(stderr, "wm_llm: session '%s' starts afresh\n", o_.session.c_str());
      return;
    }
    resumed_ = wm::llm::load_session(session_, *store_, o_.session);
    if (!resumed_) {
      std::fprintf(stderr, "wm_llm: session '%s' is new\n", o_.session.c_str());
      return;
    }
    last_stop_im_end_ = im_end_ && session_.pending_token() == im_end_;
    std::fprintf(stderr, "wm_llm: session '%s' resumed: %lld tokens in context\n", o_.session.c_str(),
                 static_cast<long long>(session_.next_position()));
  }

  // The options with the stop tokens: --stop-token, the model's and generation_config.json's end
  // tokens, and <|im_end|> in a chat.
  wm::llm::GenerateOptions generate_options() const {
    const auto& defaults = src_.generation;
    wm::llm::GenerateOptions gen = o_.gen;
    gen.stop_tokens = o_.stop_tokens;
    for (int64_t e : model_->config().eos_token_ids) gen.stop_tokens.push_back(e);
    for (int64_t e : defaults.eos_token_ids) gen.stop_tokens.push_back(e);
    if (o_.chat) {
      if (!im_end_) throw wm::Error("--chat: the tokenizer has no <|im_end|> token (not a ChatML model)");
      gen.stop_tokens.push_back(*im_end_);
    }
    const int64_t V = model_->config().vocab_size;
    for (int64_t t : gen.stop_tokens)
      if (t < 0 || t >= V) throw wm::Error(wm::str_cat("stop token ", t, " is outside the vocabulary [0, ", V, ")"));
    return gen;
  }

  wm::llm::SessionOptions session_options() const {
    wm::llm::SessionOptions so;
    so.prefill_chunk = o_.prefill_chunk;
    so.memory = o_.memory;
    if (wm::llm::make_text_policy(o_.memory)->block_wise())
      throw wm::Error(wm::str_cat("--policy ", o_.memory.policy, " takes its context as named blocks; wm_llm feeds a "
                                  "prompt as one, so use it through wm_llm_bench for now"));
    if (o_.beams > 0 && o_.memory.policy != "full")
      throw wm::Error("--beams keeps the whole context (its beam table); --policy works with sampling only");
    return so;
  }

  void show_prefill(int64_t done, int64_t total) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - prefill_t0_).count();
    if (s < 2 && !prefill_shown_) return;
    prefill_shown_ = true;
    progress_.show(done == total, "wm_llm: prefill %lld/%lld tokens, %.0f s", static_cast<long long>(done),
                   static_cast<long long>(total), s);
    if (done == total) progress_.finish();
  }

  std::vector<int64_t> encode_turn(const std::string& text, bool first) const {
    if (!o_.chat) {
      // add_special: the tokenizer's template tokens (Llama-3's BOS), as the reference adds them.
      return tok_.encode(text, o_.raw_special, true);
    }
    std::vector<wm::llm::ChatMessage> msgs;
    if (first && !o_.system.empty()) msgs.push_back({"system", o_.system});
    msgs.push_back({"user", text});
    // Message text is text: "<|im_start|>" typed by the user is not a special token. The first
    // turn is the model's template (its default system message among what it adds); later turns
    // are ChatML blocks, which the template writes too (checked when the chat starts).
    if (first) return wm::llm::encode_chat(tok_, tmpl_, msgs, true);
    std::vector<int64_t> ids = wm::llm::encode_chatml(tok_, msgs, true);
    {
      // Close the previous assistant message: its <|im_end|> is pending in the session when
      // it ended on it; otherwise (token limit, stop string, another end token) add one.
      std::vector<int64_t> join = tok_.encode(last_stop_im_end_ ? "\n" : "<|im_end|>\n", true);
      ids.insert(ids.begin(), join.begin(), join.end());
    }
    return ids;
  }

  // The context after n_ids more tokens: its K/V and a prefill chunk's attention scores must fit
  // in memory before the prefill starts; beyond the trained positions it warns once (or throws
  // with --strict-positions).
  void check_context(size_t n_ids) {
    const auto& config = model_->config();
    const int64_t max_new = gen_.max_new_tokens;
    const int64_t reach = session_.next_position() + static_cast<int64_t>(n_ids);
    wm::llm::check_fits_in_memory(
        wm::llm::llm_context_bytes(config, reach + max_new, o_.prefill_chunk, c10::elementSize(dt_)),
        wm::str_cat("a context of ", reach + max_new, " tokens"),
        wm::str_cat("the prompt's ", n_ids, " tokens, --max-new-tokens ", max_new, ", --prefill-chunk ",
                    o_.prefill_chunk));
    const int64_t max_positions = config.max_position_embeddings;
    if (reach <= max_positions) return;
    const std::string msg =
        wm::str_cat("the context reaches position ", reach, ", beyond the ", max_positions,
                    " positions the model was trained on (",
                    src_.gguf ? "context_length in " + o_.model_dir : "max_position_embeddings in " + o_.model_dir + "/config.json",
                    ")");
    if (o_.strict_positions) throw wm::Error(msg + " (--strict-positions)");
    if (!warned_positions_)
      std::fprintf(stderr, "wm_llm: warning: %s: expect text that makes little sense (--strict-positions refuses)\n",
                   msg.c_str());
    warned_positions_ = true;
  }

  void run_beams(const std::vector<int64_t>& ids) {
    wm::llm::BeamOptions bo;
    bo.num_beams = o_.beams;
    bo.max_new_tokens = gen_.max_new_tokens;
    bo.length_penalty = o_.length_penalty;
    bo.eos_token_ids = gen_.stop_tokens;
    bo.prefill_chunk = o_.prefill_chunk;
    const auto r = wm::llm::beam_search(*model_, ids, bo, dev_, dt_);
    for (size_t i = 0; i < r.beams.size(); ++i) {
      const auto& b = r.beams[i];
      std::vector<int64_t> shown = b.tokens;
      if (b.finished && !shown.empty()) shown.pop_back();
      char head[128];
      std::snprintf(head, sizeof head, "[beam %zu] score %.4f ranked %.4f%s: ", i, b.score, b.ranked,
                    b.finished ? " (ended)" : "");
      const std::string line = head + tok_.decode(shown) + "\n";
      write_stdout(line.data(), line.size());
    }
    std::fprintf(stderr, "wm_llm: beam cache %.2f MiB, K/V bytes copied by reorders: %zu\n",
                 r.cache_bytes / 1048576.0, r.bytes_copied);
    std::vector<int64_t> best = r.beams[0].tokens;
    if (r.beams[0].finished && !best.empty()) best.pop_back();
    turns_.push_back({{"beams", o_.beams}, {"best", tok_.decode(best)}, {"score", r.beams[0].score}});
  }

  void run_sampling(const std::vector<int64_t>& ids, bool first) {
    auto on_text = [&](const std::string& s) {
      if (!o_.no_stream) write_stdout(s.data(), s.size());
    };
    wm::llm::Generation g = session_.generate(ids, gen_, on_text);
    last_stop_im_end_ =
        im_end_ && g.stop_reason == "stop_token" && !g.tokens.empty() && g.tokens.back() == *im_end_;
    if (o_.no_stream) write_stdout(g.text.data(), g.text.size());
    write_stdout("\n", 1);
    print_stats(g.stats);
    if (logits_file_ && first) {
      wm::cli::write_npy(*logits_file_, g.prompt_logits);
      std::fprintf(stderr, "wm_llm: the prompt's last logits [%lld] go to %s\n",
                   static_cast<long long>(g.prompt_logits.numel()), o_.dump_logits.c_str());
    }
    nlohmann::json j = stats_json(g.stats);
    j["stop_reason"] = g.stop_reason;
    j["text"] = g.text;
    turns_.push_back(j);
  }

  const Options& o_;
  const at::Device dev_;
  const at::ScalarType dt_;
  wm::cli::OutputFile* const logits_file_;  // --dump-logits (the first turn's), or null
  wm::llm::LlmSource src_;
  wm::llm::LlmModel model_;
  const wm::llm::Tokenizer tok_;
  const wm::llm::ChatTemplate tmpl_;
  const std::optional<int64_t> im_end_;
  wm::llm::GenerateOptions gen_;
  wm::llm::LlmSession session_;
  nlohmann::json turns_ = nlohmann::json::array();
  bool last_stop_im_end_ = false;  // the last turn ended on <|im_end|>, which the session holds
  std::shared_ptr<wm::RemoteStore> store_;  // --session's kv store
  bool resumed_ = false;                    // the context holds turns (resumed or run): no system message
  bool warned_positions_ = false;
  wm::cli::ProgressLine progress_{15};
  std::chrono::steady_clock::time_point prefill_t0_;
  bool prefill_shown_ = false;
};

// Chat with no prompt: every non-empty line of standard input is a user turn.
void chat_from_stdin(Conversation& conv, int64_t max_prompt_bytes) {
  const bool tty = isatty(fileno(stdin)) != 0;
  std::string line;
  bool first = true;
  if (tty) std::fprintf(stderr, "wm_llm: chat; one line per turn, end with Ctrl-D\n> ");
  while (read_line_bounded(line, max_prompt_bytes)) {
    if (!line.empty()) {
      conv.run_turn(line, first);
      first = false;
    }
    if (tty) std::fprintf(stderr, "> ");
  }
  if (first) throw wm::Error("no chat turns on standard input");
}

// The one prompt: --prompt, else --prompt-file, else standard input. Throws wm::Error when empty.
std::string read_prompt(const Options& o) {
  const std::string path = prompt_path(o);
  std::string text = !o.prompt.empty() ? o.prompt
                     : !path.empty()   ? read_prompt_file(path, o.max_prompt_bytes)
                                       : read_bounded(std::cin, o.max_prompt_bytes, "standard input");
  if (text.empty()) throw wm::Error("the prompt is empty (give --prompt, --prompt-file or standard input)");
  return text;
}

// --perplexity: the file's tokens (no special tokens parsed, none added) scored window by window.
void run_perplexity(const Options& o, at::Device dev, at::ScalarType dt) {
  if (o.chat || o.beams > 0 || !o.prompt.empty() || !o.prompt_file.empty())
    throw wm::Error("--perplexity scores a file: it does not combine with --chat, --beams or a prompt");
  const std::string text = read_prompt_file(o.perplexity_file, o.max_prompt_bytes);
  wm::llm::LlmSource src = wm::llm::open_llm(o.model_dir, dev, dt, gguf_weights(o));
  if (o.weights == "int8") src.model->quantize_int8();
  std::vector<int64_t> ids = src.tokenizer->encode(text, false, false);
  const size_t in_file = ids.size();
  const auto keep = static_cast<size_t>(o.perplexity_windows * o.perplexity_window);
  if (o.perplexity_windows > 0 && ids.size() > keep) ids.resize(keep);
  wm::cli::ProgressLine progress(15);
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = wm::llm::perplexity(*src.model, ids, o.perplexity_window, [&](int64_t done, int64_t total) {
    progress.show(done == total, "wm_llm: perplexity window %lld/%lld", static_cast<long long>(done),
                  static_cast<long long>(total));
  });
  progress.finish();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("perplexity %.4f (mean NLL %.6f) over %lld tokens scored in %zu windows of %lld (%zu tokens in the file)\n",
              r.perplexity, r.mean_nll, static_cast<long long>(r.scored), r.window_nll.size(),
              static_cast<long long>(o.perplexity_window), in_file);
  std::fprintf(stderr, "wm_llm: %.1f s, %.0f tokens/s\n", s,
               static_cast<double>(r.window_nll.size() * o.perplexity_window) / s);
}

void write_outputs(const Options& o, at::Device dev, const nlohmann::json& turns, Outputs& out) {
  if (out.stats) {
    // Generated text need not be valid UTF-8: invalid bytes are written as U+FFFD.
    const nlohmann::json j{{"model", o.model_dir}, {"device", wm::describe_device(dev)}, {"turns", turns}};
    out.stats->stream() << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    out.stats->commit();
  }
  if (out.logits) out.logits->commit();
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (const std::optional<int> status = parse_options(argc, argv, o)) return *status;
  wm::cli::remove_temporaries_on_signal();

  try {
    check_given_values(o);
    wm::init_threads(o.threads);
    const at::Device dev = wm::parse_device(o.device);
    const at::ScalarType dt = wm::parse_compute_dtype(o.dtype);
    if (dt == at::kHalf && dev.is_cpu())
      throw wm::Error("--dtype float16 is not supported on the CPU (libtorch's CPU kernels lack it): use bfloat16 or "
                      "float32");
    const at::ScalarType kvdt = o.kv_dtype.empty() ? dt : wm::parse_compute_dtype(o.kv_dtype);
    if (o.weights == "int8" && !dev.is_cpu())
      throw wm::Error(wm::str_cat("--weights int8 runs on the CPU only; the device is ", o.device));
    if (!o.model_given) o.model_dir = find_embedded_model();
    check_distinct_outputs(o);
    check_generation_options(o);
    Outputs out = open_outputs(o);

    if (!o.perplexity_file.empty()) {
      run_perplexity(o, dev, dt);
      return 0;
    }
    Conversation conv(o, dev, dt, kvdt, out.logits.get());
    if (o.chat && o.prompt.empty() && o.prompt_file.empty())
      chat_from_stdin(conv, o.max_prompt_bytes);
    else
      conv.run_turn(read_prompt(o), true);
    write_outputs(o, dev, conv.turns(), out);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "wm_llm: error: %s\n", wm::cli::error_text(e).c_str());
    return 1;
  } catch (...) {
    std::fprintf(stderr, "wm_llm: error: an unknown failure\n");
    return 1;
  }
  return 0;
}

}  // namespace wm_tool_llm
