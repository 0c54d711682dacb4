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
#include <sstream>

#include "llmkv/beam.h"
#include "llmkv/chat_template.h"
#include "llmkv/config.h"
#include "llmkv/hf_folder.h"
#include "llmkv/session.h"
#include "llmkv/tokenizer.h"
#include "llmkv/weight_shapes.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "tools/cli/cleanup.h"
#include "tools/cli/distinct_outputs.h"
#include "tools/cli/error_text.h"
#include "tools/cli/npy.h"
#include "tools/cli/output_file.h"
#include "tools/cli/progress.h"
#include "tools/cli/shipped_path.h"
#include "tools/cli/validators.h"

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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "wm_llm: generate or chat with a Llama/Qwen2-family decoder from a Hugging Face model folder\n"
      "(config.json, model.safetensors or sharded shards with model.safetensors.index.json, tokenizer.json)"};
  std::string model_dir = kEmbeddedModel;
  std::string prompt, prompt_file, system, dump_logits, stats_json_path, device = "auto", dtype = "float32";
  bool chat = false, no_stream = false, raw_special = false, strict_positions = false;
  int64_t max_prompt_bytes = int64_t{256} << 10;  // ~64k tokens of English text
  wm::llm::GenerateOptions gen;
  std::vector<int64_t> stop_tokens;
  int beams = 0, threads = 0;
  double length_penalty = 1.0;
  int64_t prefill_chunk = 512;
  wm::llm::TextMemoryConfig memory;
  auto* m_opt = app.add_option("-m,--model", model_dir,
                               "model folder (default: the embedded tiny model, looked for in the working directory, "
                               "then above this program's folder)")
                    ->capture_default_str();
  auto* p_opt = app.add_option("-p,--prompt", prompt, "prompt text (else --prompt-file, else standard input)");
  auto* f_opt = app.add_option("-f,--prompt-file", prompt_file, "read the prompt from this file ('-': standard input)")
      ->excludes(p_opt);
  app.add_option("--max-prompt-bytes", max_prompt_bytes,
                 "a prompt file or standard input (or a chat line) longer than this is refused")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app.add_flag("--strict-positions", strict_positions,
               "refuse a prompt that reaches beyond the model's trained positions (max_position_embeddings) "
               "instead of warning");
  app.add_flag("--chat", chat,
               "chat: wrap prompts in the ChatML template; with no prompt, every line of standard input is a user turn");
  app.add_option("--system", system, "system message (chat)");
  app.add_option("-n,--max-new-tokens", gen.max_new_tokens, "tokens to generate at most")
      ->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("-t,--temperature", gen.sampling.temperature, "0: greedy")
      ->capture_default_str()->check(wm::cli::FiniteRange(0.0, 100.0));
  app.add_option("--top-k", gen.sampling.top_k, "keep the k most probable tokens (0: all)")
      ->capture_default_str()->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  app.add_option("--top-p", gen.sampling.top_p, "nucleus mass in (0, 1]")
      ->capture_default_str()->check(wm::cli::FiniteRange(0.0, 1.0));
  app.add_option("--seed", gen.sampling.seed, "sampling seed")->capture_default_str()->check(wm::cli::Uint64());
  app.add_option("--stop", gen.stop_strings, "stop string (repeatable)");
  app.add_option("--stop-token", stop_tokens, "stop token id (repeatable; the model's end tokens always stop)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 31));
  app.add_option("--beams", beams, "beam search with this many beams (0: sample)")->check(CLI::Range(0, 64));
  app.add_option("--length-penalty", length_penalty, "beam ranking: score / length^penalty")
      ->check(wm::cli::FiniteRange(-10.0, 10.0));
  app.add_option("--prefill-chunk", prefill_chunk, "prompt tokens per forward pass")
      ->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--policy", memory.policy, "KV memory policy")
      ->capture_default_str()
      ->check(CLI::IsMember(wm::llm::text_policy_names()));
  auto* budget_opt =
      app.add_option("--kv-budget", memory.budget, "KV tokens per layer the policy keeps (needed by all but full)")
          ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app.add_option("--sink", memory.sink, "streaming_llm: attention-sink tokens")->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("--window", memory.window, "snapkv, pyramidkv: observation window (last prompt queries)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_flag("!--no-prompt-restart", memory.prompt_restart,
               "keepkv: a prompt step adds its attention to the scores' moving average instead of restarting them");
  app.add_option("--score-kernel", memory.score_kernel,
                 "keepkv: max-pooling width over its scores before choosing what to keep (odd; 1: none, KeepKV as "
                 "published)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 10));
  app.add_option("--score-window", memory.score_window,
                 "keepkv: each step's attention scores from its last N queries (0: from all of them)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("--dump-logits", dump_logits, "write the logits at the prompt's last position to this .npy file");
  app.add_option("--stats-json", stats_json_path, "write timing and KV figures as JSON to this file");
  app.add_flag("--no-stream", no_stream, "print the text at the end instead of as it is generated");
  app.add_flag("--parse-special", raw_special, "match special tokens (e.g. <|im_start|>) in the prompt text");
  app.add_option("--device", device, "auto, cpu, cuda, cuda:N")->capture_default_str();
  app.add_option("--dtype", dtype, "float32, float16, bfloat16")->capture_default_str();
  app.add_option("--threads", threads, "CPU threads (0: all cores)")->check(CLI::Range(0, 1024));
  app.footer("--dump-logits and --stats-json are written whole when the run succeeds, and not at all when it fails.");
  CLI11_PARSE(app, argc, argv);
  wm::cli::remove_temporaries_on_signal();

  try {
    if (m_opt->count() > 0 && model_dir.empty()) throw wm::Error("--model is empty");
    if (p_opt->count() > 0 && prompt.empty())
      throw wm::Error("--prompt is empty (give the text, or --prompt-file, or the prompt on standard input)");
    if (f_opt->count() > 0 && prompt_file.empty()) throw wm::Error("--prompt-file is empty");
    if (budget_opt->count() > 0 && memory.policy == "full")
      throw wm::Error("--kv-budget applies to a memory policy that evicts: --policy full keeps every token");
    wm::init_threads(threads);
    const at::Device dev = wm::parse_device(device);
    const at::ScalarType dt = wm::parse_compute_dtype(dtype);
    if (dt == at::kHalf && dev.is_cpu())
      throw wm::Error("--dtype float16 is not supported on the CPU (libtorch's CPU kernels lack it): use bfloat16 or "
                      "float32");
    if (m_opt->count() == 0) {
      std::string tried;
      model_dir = wm::cli::find_shipped(kEmbeddedModel, &tried);
      if (model_dir.empty())
        throw wm::Error(wm::str_cat("the embedded tiny LLM (", kEmbeddedModel, ") was not found; tried ", tried,
                                    ": give --model with a Hugging Face model folder"));
    }
    const std::string prompt_path = prompt_file == "-" ? "" : prompt_file;
    wm::cli::require_distinct_outputs(
        {{"--dump-logits", dump_logits}, {"--stats-json", stats_json_path}},
        {{"--prompt-file", prompt_path},
         {"the model's config.json", model_dir + "/config.json"},
         {"the model's tokenizer.json", model_dir + "/tokenizer.json"},
         {"the model's generation_config.json", model_dir + "/generation_config.json"},
         {"the model's model.safetensors", model_dir + "/model.safetensors"},
         {"the model's model.safetensors.index.json", model_dir + "/model.safetensors.index.json"}});
    if (!(gen.sampling.top_p > 0)) throw wm::Error("--top-p must be in (0, 1]: 0 keeps no token");
    gen.sampling.validate();  // the rest, with a message naming the field
    for (const auto& s : gen.stop_strings)
      if (s.empty()) throw wm::Error("--stop: an empty stop string would stop at once");
    if (beams > 0) {
      if (chat) throw wm::Error("--beams searches from one prompt: it does not combine with --chat");
      if (!dump_logits.empty()) throw wm::Error("--dump-logits is not available with --beams");
      if (gen.sampling.temperature != 0.0 || gen.sampling.top_k != 0 || gen.sampling.top_p != 1.0)
        throw wm::Error("--beams ranks by log-probability: --temperature, --top-k and --top-p do not apply");
      if (!gen.stop_strings.empty()) throw wm::Error("--stop is not available with --beams (use --stop-token)");
    }
    // Outputs opened before the model (a bad path fails before the work), committed together at the end.
    std::unique_ptr<wm::cli::OutputFile> logits_file, stats_file;
    if (!dump_logits.empty()) logits_file = std::make_unique<wm::cli::OutputFile>(dump_logits);
    if (!stats_json_path.empty()) stats_file = std::make_unique<wm::cli::OutputFile>(stats_json_path);

    wm::llm::LlmModel model = wm::llm::load_llm(model_dir, dev, dt);
    const wm::llm::Tokenizer tok = wm::llm::Tokenizer::load(model_dir + "/tokenizer.json");
    const auto defaults = wm::llm::GenerationDefaults::load(model_dir + "/generation_config.json");
    gen.stop_tokens = stop_tokens;
    for (int64_t e : model->config().eos_token_ids) gen.stop_tokens.push_back(e);
    for (int64_t e : defaults.eos_token_ids) gen.stop_tokens.push_back(e);
    std::optional<int64_t> im_end = tok.token_to_id("<|im_end|>");
    if (chat) {
      if (!im_end) throw wm::Error("--chat: the tokenizer has no <|im_end|> token (not a ChatML model)");
      gen.stop_tokens.push_back(*im_end);
    }
    const int64_t V = model->config().vocab_size;
    for (int64_t t : gen.stop_tokens)
      if (t < 0 || t >= V) throw wm::Error(wm::str_cat("stop token ", t, " is outside the vocabulary [0, ", V, ")"));

    wm::llm::SessionOptions so;
    so.prefill_chunk = prefill_chunk;
    so.memory = memory;
    if (wm::llm::make_text_policy(memory)->block_wise())
      throw wm::Error(wm::str_cat("--policy ", memory.policy, " takes its context as named blocks; wm_llm feeds a "
                                  "prompt as one, so use it through wm_llm_bench for now"));
    if (beams > 0 && memory.policy != "full")
      throw wm::Error("--beams keeps the whole context (its beam table); --policy works with sampling only");
    wm::llm::LlmSession session(model, tok, dev, dt, so);
    nlohmann::json turns = nlohmann::json::array();
    bool last_stop_im_end = false;
    auto on_text = [&](const std::string& s) {
      if (!no_stream) write_stdout(s.data(), s.size());
    };
    // Long prefills show their progress (after 2 s, so that short prompts stay quiet).
    wm::cli::ProgressLine progress(15);
    std::chrono::steady_clock::time_point prefill_t0;
    bool prefill_shown = false;
    gen.on_prefill = [&](int64_t done, int64_t total) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - prefill_t0).count();
      if (s < 2 && !prefill_shown) return;
      prefill_shown = true;
      progress.show(done == total, "wm_llm: prefill %lld/%lld tokens, %.0f s", static_cast<long long>(done),
                    static_cast<long long>(total), s);
      if (done == total) progress.finish();
    };
    const int64_t max_positions = model->config().max_position_embeddings;
    bool warned_positions = false;

    // One turn: prompt text -> tokens -> generation (or beams); prints and records it.
    auto run_turn = [&](const std::string& text, bool first) {
      std::vector<int64_t> ids;
      if (chat) {
        std::vector<wm::llm::ChatMessage> msgs;
        if (first && !system.empty()) msgs.push_back({"system", system});
        msgs.push_back({"user", text});
        // Message text is text: "<|im_start|>" typed by the user is not a special token.
        ids = wm::llm::encode_chatml(tok, msgs, true);
        if (!first) {
          // Close the previous assistant message: its <|im_end|> is pending in the session when
          // it ended on it; otherwise (token limit, stop string, another end token) add one.
          std::vector<int64_t> join = tok.encode(last_stop_im_end ? "\n" : "<|im_end|>\n", true);
          ids.insert(ids.begin(), join.begin(), join.end());
        }
      } else {
        // add_special: the tokenizer's template tokens (Llama-3's BOS), as the reference adds them.
        ids = tok.encode(text, raw_special, true);
      }
      if (ids.empty() && session.next_position() == 0) throw wm::Error("the prompt is empty");
      const int64_t reach = session.next_position() + static_cast<int64_t>(ids.size());
      // The context's K/V and a prefill chunk's attention scores must fit before the prefill starts.
      wm::llm::check_fits_in_memory(
          wm::llm::llm_context_bytes(model->config(), reach + gen.max_new_tokens, prefill_chunk, c10::elementSize(dt)),
          wm::str_cat("a context of ", reach + gen.max_new_tokens, " tokens"),
          wm::str_cat("the prompt's ", ids.size(), " tokens, --max-new-tokens ", gen.max_new_tokens,
                      ", --prefill-chunk ", prefill_chunk));
      if (reach > max_positions) {
        const std::string msg =
            wm::str_cat("the context reaches position ", reach, ", beyond the ", max_positions,
                        " positions the model was trained on (max_position_embeddings in ", model_dir, "/config.json)");
        if (strict_positions) throw wm::Error(msg + " (--strict-positions)");
        if (!warned_positions)
          std::fprintf(stderr, "wm_llm: warning: %s: expect text that makes little sense (--strict-positions refuses)\n",
                       msg.c_str());
        warned_positions = true;
      }
      prefill_t0 = std::chrono::steady_clock::now();
      prefill_shown = false;
      if (beams > 0) {
        wm::llm::BeamOptions bo;
        bo.num_beams = beams;
        bo.max_new_tokens = gen.max_new_tokens;
        bo.length_penalty = length_penalty;
        bo.eos_token_ids = gen.stop_tokens;
        bo.prefill_chunk = prefill_chunk;
        const auto r = wm::llm::beam_search(*model, ids, bo, dev, dt);
        for (size_t i = 0; i < r.beams.size(); ++i) {
          const auto& b = r.beams[i];
          std::vector<int64_t> shown = b.tokens;
          if (b.finished && !shown.empty()) shown.pop_back();
          char head[128];
          std::snprintf(head, sizeof head, "[beam %zu] score %.4f ranked %.4f%s: ", i, b.score, b.ranked,
                        b.finished ? " (ended)" : "");
          const std::string line = head + tok.decode(shown) + "\n";
          write_stdout(line.data(), line.size());
        }
        std::fprintf(stderr, "wm_llm: beam cache %.2f MiB, K/V bytes copied by reorders: %zu\n",
                     r.cache_bytes / 1048576.0, r.bytes_copied);
        std::vector<int64_t> best = r.beams[0].tokens;
        if (r.beams[0].finished && !best.empty()) best.pop_back();
        turns.push_back({{"beams", beams}, {"best", tok.decode(best)}, {"score", r.beams[0].score}});
        return;
      }
      wm::llm::Generation g = session.generate(ids, gen, on_text);
      last_stop_im_end = im_end && g.stop_reason == "stop_token" && !g.tokens.empty() && g.tokens.back() == *im_end;
      if (no_stream) write_stdout(g.text.data(), g.text.size());
      write_stdout("\n", 1);
      print_stats(g.stats);
      if (logits_file && first) {
        wm::cli::write_npy(*logits_file, g.prompt_logits);
        std::fprintf(stderr, "wm_llm: the prompt's last logits [%lld] go to %s\n",
                     static_cast<long long>(g.prompt_logits.numel()), dump_logits.c_str());
      }
      nlohmann::json j = stats_json(g.stats);
      j["stop_reason"] = g.stop_reason;
      j["text"] = g.text;
      turns.push_back(j);
    };

    if (chat && prompt.empty() && prompt_file.empty()) {
      const bool tty = isatty(fileno(stdin)) != 0;
      std::string line;
      bool first = true;
      if (tty) std::fprintf(stderr, "wm_llm: chat; one line per turn, end with Ctrl-D\n> ");
      while (read_line_bounded(line, max_prompt_bytes)) {
        if (!line.empty()) {
          run_turn(line, first);
          first = false;
        }
        if (tty) std::fprintf(stderr, "> ");
      }
      if (first) throw wm::Error("no chat turns on standard input");
    } else {
      std::string text = !prompt.empty()       ? prompt
                         : !prompt_path.empty() ? read_prompt_file(prompt_path, max_prompt_bytes)
                                                : read_bounded(std::cin, max_prompt_bytes, "standard input");
      if (text.empty()) throw wm::Error("the prompt is empty (give --prompt, --prompt-file or standard input)");
      run_turn(text, true);
    }
    if (stats_file) {
      // Generated text need not be valid UTF-8: invalid bytes are written as U+FFFD.
      stats_file->stream() << nlohmann::json{{"model", model_dir}, {"device", wm::describe_device(dev)}, {"turns", turns}}
                                  .dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
                           << "\n";
      stats_file->commit();
    }
    if (logits_file) logits_file->commit();
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
