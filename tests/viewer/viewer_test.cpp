// wm_viewer: the input/script/layout logic of wm_viewer_core, and the viewer itself run as a
// subprocess under X (Xvfb started here when there is no DISPLAY) with injected key and mouse
// events: the pose follows the input, the screenshot holds the frame and the HUD, keys switch
// the policy, record, change the scene, and the program exits cleanly.
#include <gtest/gtest.h>

#ifndef WM_VIEWER_BIN

TEST(Viewer, NotConfigured) {
  GTEST_SKIP() << "wm_tests was built without WM_VIEWER_BIN (wm_viewer not built: WM_BUILD_VIEWER off or SDL2 "
                  "missing, or tests/CMakeLists.txt does not link wm_viewer_core)";
}

#else

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "dit/config.h"
#include "dit/lingbot_weights.h"
#include "dit/model.h"
#include "dit/umt5_tokenizer.h"
#include "dit/weights.h"
#include "runtime/build_paths.h"
#include "runtime/error.h"
#include "runtime/safetensors.h"
#include "tools/media/png.h"
#include "tests/temp_dir.h"
#include "tests/worldkv/synthetic.h"
#include "tools/bench_dit/random_umt5.h"
#include "tools/bench_dit/random_wan_vae.h"
#include "tools/world/scene.h"
#include "tools/rollout/mg2_start.h"
#include "viewer/app.h"
#include "viewer/font.h"
#include "viewer/generator.h"
#include "viewer/hud.h"
#include "viewer/input.h"
#include "viewer/layout.h"
#include "viewer/mg2_hud.h"
#include "viewer/mg2_input.h"
#include "viewer/mg2_view.h"
#include "viewer/palette.h"
#include "viewer/script.h"
#include "viewer/tiny_view.h"
#include "worldkv/mg2_adapter.h"

namespace fs = std::filesystem;
namespace wv = wm::viewer;

// ---------------------------------------------------------------- logic, no window

TEST(ViewerInput, HeldKeysMoveEveryFrameTapsOnce) {
  wv::InputState in;
  in.press(wv::Control::Forward, 26);
  EXPECT_EQ(in.sample().forward, 1);
  EXPECT_EQ(in.sample().forward, 1);  // still held
  in.release(wv::Control::Forward, 26);
  EXPECT_EQ(in.sample().forward, 0);
  in.press(wv::Control::Right, 7);  // a tap between two samples still counts, once
  in.release(wv::Control::Right, 7);
  EXPECT_EQ(in.sample().strafe, 1);
  EXPECT_EQ(in.sample().strafe, 0);
  in.press(wv::Control::Forward, 1);  // W and S cancel
  in.press(wv::Control::Back, 2);
  EXPECT_EQ(in.sample().forward, 0);
}

TEST(ViewerInput, MouseYawIsCappedPerFrameAndCarriesOver) {
  wv::InputState in;  // 0.15 deg/px, cap 15, quantum 0.5
  in.mouse_motion(240);  // 36 degrees
  EXPECT_DOUBLE_EQ(in.sample().dyaw_deg, 15.0);
  EXPECT_DOUBLE_EQ(in.sample().dyaw_deg, 15.0);
  EXPECT_DOUBLE_EQ(in.sample().dyaw_deg, 6.0);
  EXPECT_DOUBLE_EQ(in.sample().dyaw_deg, 0.0);
  in.mouse_motion(-2);  // -0.3: under one quantum, waits
  EXPECT_DOUBLE_EQ(in.sample().dyaw_deg, 0.0);
  in.mouse_motion(-2);  // -0.6 in all
  EXPECT_DOUBLE_EQ(in.sample().dyaw_deg, -0.5);
  in.press(wv::Control::TurnLeft, 80);
  EXPECT_DOUBLE_EQ(in.sample().dyaw_deg, -7.5);
}

TEST(ViewerScript, ParsesCommandsAndExpandsHold) {
  auto steps = wv::parse_script("hold W 4c; mouse 200 -3 # turn right\nwait 500ms;screenshot a.png\nclick;quit", "t");
  ASSERT_EQ(steps.size(), 8u);
  EXPECT_EQ(steps[0].kind, wv::ScriptStep::Kind::KeyDown);
  EXPECT_EQ(steps[0].key, "W");
  EXPECT_EQ(steps[1].kind, wv::ScriptStep::Kind::Wait);
  EXPECT_EQ(steps[1].wait.unit, wv::ScriptDuration::Unit::Chunks);
  EXPECT_EQ(steps[1].wait.value, 4);
  EXPECT_EQ(steps[2].kind, wv::ScriptStep::Kind::KeyUp);
  EXPECT_EQ(steps[3].kind, wv::ScriptStep::Kind::Mouse);
  EXPECT_EQ(steps[3].dx, 200);
  EXPECT_EQ(steps[3].dy, -3);
  EXPECT_EQ(steps[4].wait.value, 500);
  EXPECT_EQ(steps[4].where, "t:2");
  EXPECT_EQ(steps[5].path, "a.png");
  EXPECT_EQ(steps[6].kind, wv::ScriptStep::Kind::Click);
  EXPECT_EQ(steps[7].kind, wv::ScriptStep::Kind::Quit);
  EXPECT_EQ(wv::parse_duration("2s").value, 2000);
  EXPECT_EQ(wv::parse_duration("12f").unit, wv::ScriptDuration::Unit::Frames);
  EXPECT_THROW(wv::parse_script("jump", "t"), wm::Error);
  EXPECT_THROW(wv::parse_script("wait 3", "t"), wm::Error);
  EXPECT_THROW(wv::parse_script("hold W", "t"), wm::Error);
  try {
    wv::parse_script("wait 1c\nfly W", "s.txt");
    FAIL();
  } catch (const wm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("s.txt:2"), std::string::npos) << e.what();
  }
}

TEST(ViewerLayout, FramesFitWholeScaleBesideThePanel) {
  const auto one = wv::compute_layout(1280, 720, 64, 64, false, 0);
  EXPECT_EQ(one.frame.w, 64 * one.scale);
  EXPECT_GE(one.scale, 6);
  EXPECT_EQ(one.gt.w, 0);
  EXPECT_LE(one.frame.x + one.frame.w, one.panel.x);
  EXPECT_LE(one.bar.y + one.bar.h, 720);
  const auto two = wv::compute_layout(1280, 720, 64, 64, true, 0);
  EXPECT_EQ(two.gt.w, two.frame.w);
  EXPECT_GE(two.gt.x, two.frame.x + two.frame.w);
  EXPECT_LE(two.gt.x + two.gt.w, two.panel.x);
  EXPECT_EQ(wv::compute_layout(1280, 720, 64, 64, false, 3).scale, 3);
  EXPECT_EQ(wv::compute_layout(1280, 720, 64, 64, false, 50).scale, one.scale);  // capped to fit
  int w = 0, h = 0;
  wv::window_size_for_scale(4, 64, 64, w, h);
  EXPECT_EQ(wv::compute_layout(w, h, 64, 64, true, 0).scale, 4);
}

TEST(ViewerStart, StartPoseIsFreeAndFacesAFreeRun) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    const auto scene = wm::world::generate_scene(wm::world::random_world_params(seed));
    const auto p = wv::start_pose(scene);
    const int cx = static_cast<int>(std::floor(p.x)), cy = static_cast<int>(std::floor(p.y));
    EXPECT_FALSE(scene.is_solid(cx, cy));
    double dx, dy;
    wm::world::heading(p.yaw_deg, dx, dy);
    EXPECT_FALSE(scene.is_solid(cx + static_cast<int>(std::lround(dx)), cy + static_cast<int>(std::lround(dy))))
        << "seed " << seed;
  }
}

// The HUD's retrieved slots are the memory's own: worldkv_c filling its region by tokens holds
// 6 compressed chunks of the synthetic model (9 frames of 4 tokens over 4 + ceil(0.25 * 8)), not
// worldkv's 3; policies without retrieval have none.
TEST(ViewerSnapshot, RetrievedCapacityFollowsTheMemorysLayout) {
  wm::worldkv::Synthetic syn;
  for (auto [policy, fill, want] : {std::tuple{wm::worldkv::Policy::WorldKv, false, 3},
                                    std::tuple{wm::worldkv::Policy::WorldKvC, false, 3},
                                    std::tuple{wm::worldkv::Policy::WorldKvC, true, 6},
                                    std::tuple{wm::worldkv::Policy::SlidingWindow, false, 0}}) {
    SCOPED_TRACE(policy.name() + (fill ? " fill_by_tokens" : ""));
    wm::worldkv::MemoryConfig cfg;
    cfg.tokens_per_frame = syn.tpf;
    cfg.policy = policy;
    cfg.fill_by_tokens = fill;
    wm::worldkv::WorldMemory mem(syn.spec, cfg);
    for (int64_t i = 0; i < 8; ++i) {
      mem.prepare(i, wm::worldkv::poses_at(i, 0));
      mem.commit(i, syn.chunk(i, 3), wm::worldkv::poses_at(i, 0));
    }
    mem.prepare(8, wm::worldkv::poses_at(2, 0));
    const wv::MemorySnapshot s = wv::snapshot_memory(
        mem, 8, {}, mem.policy().banks() ? mem.region_ids("retrieved") : std::vector<std::string>{});
    EXPECT_EQ(s.retrieved_capacity, want);
    EXPECT_EQ(s.retrieved_capacity, mem.policy().retrieved_capacity());
    if (want > 0) EXPECT_EQ(static_cast<int>(s.retrieved.size()), want);  // 6 chunks banked by now
  }
}

// DejaVu Sans Mono through SDL_ttf on a software renderer (no window): a monospace layout, the
// text drawn in the HUD's colour inside its box and nowhere else, a clear error for a missing file.
TEST(ViewerHud, FontAndFormatting) {
  SDL_Surface* surf = SDL_CreateRGBSurfaceWithFormat(0, 320, 64, 32, SDL_PIXELFORMAT_RGBA32);
  ASSERT_NE(surf, nullptr) << SDL_GetError();
  SDL_Renderer* r = SDL_CreateSoftwareRenderer(surf);
  ASSERT_NE(r, nullptr) << SDL_GetError();
  {
    const wv::Font font(r, wv::font_path());
    EXPECT_GT(font.advance(2), font.advance(1));
    EXPECT_GT(font.advance(4), font.advance(2));
    EXPECT_EQ(font.width("ab\nabcd", 2), 4 * font.advance(2));
    EXPECT_EQ(font.height("a\nb", 2), font.line_height(2) + font.height("a", 2));
    SDL_SetRenderDrawColor(r, 0, 0, 0, 255);
    SDL_RenderClear(r);
    const std::string text = "Hello, HUD";
    EXPECT_EQ(font.draw(4, 4, text, wv::palette::kText, 2), 4 + font.width(text, 2));
    SDL_RenderFlush(r);
    const SDL_Color c = wv::palette::kText;
    size_t inside = 0, outside = 0;
    for (int y = 0; y < surf->h; ++y)
      for (int x = 0; x < surf->w; ++x) {
        const uint8_t* p = static_cast<const uint8_t*>(surf->pixels) + y * surf->pitch + 4 * x;
        const bool lit = p[0] > 0 || p[1] > 0 || p[2] > 0;
        const bool in_box = x >= 4 && x < 4 + font.width(text, 2) && y >= 4 && y < 4 + font.height(text, 2);
        inside += in_box && p[0] == c.r && p[1] == c.g && p[2] == c.b;
        outside += !in_box && lit;
      }
    EXPECT_GT(inside, 20u) << "glyph pixels in the text's own colour";
    EXPECT_EQ(outside, 0u);
    EXPECT_THROW(wv::Font(r, "/nonexistent/DejaVuSansMono.ttf"), wm::Error);
  }
  SDL_DestroyRenderer(r);
  SDL_FreeSurface(surf);
  EXPECT_EQ(wv::format_bytes(512), "512 B");
  EXPECT_EQ(wv::format_bytes(3 << 20), "3.00 MB");
  EXPECT_EQ(wv::format_ms(120.4), "120 ms");
  EXPECT_EQ(wv::format_ms(61300), "61.3 s");
  EXPECT_EQ(wv::format_ms_list({120, 95.4}, {"", "  p50 "}), "120  p50 95 ms");
  EXPECT_EQ(wv::format_ms_list({61300, 9000}, {"model ", "  decode "}), "model 61.3  decode 9.0 s");
  EXPECT_EQ(wv::chunk_number("chunk:42"), 42);
  EXPECT_EQ(wv::chunk_number("file:a.py#0"), -1);
}

// One help for every view: its steering keys, the policies its digit keys pick (the tiny model
// has no window of its own, Matrix-Game-2.0's keys stop at 5), G where there is a ground truth,
// Esc where the mouse steers, the new start.
TEST(ViewerHelp, EachViewListsItsKeysAndPolicies) {
  wv::ViewerOptions o;
  const std::string tiny = wv::help_text(wv::TinyView(o));
  EXPECT_EQ(tiny.find("0 native"), std::string::npos) << tiny;
  EXPECT_NE(tiny.find("6 worldkv_attn"), std::string::npos) << tiny;
  EXPECT_NE(tiny.find("ground truth"), std::string::npos) << tiny;
  EXPECT_NE(tiny.find("Esc"), std::string::npos) << tiny;
  EXPECT_NE(tiny.find("new scene"), std::string::npos) << tiny;
  o.mode = "templerun";
  const std::string tr = wv::help_text(wv::Mg2View(o));
  EXPECT_NE(tr.find("0 native"), std::string::npos) << tr;
  EXPECT_NE(tr.find("5 sink_recent"), std::string::npos) << tr;
  EXPECT_EQ(tr.find("worldkv_attn"), std::string::npos) << tr;
  EXPECT_EQ(tr.find("ground truth"), std::string::npos) << tr;
  EXPECT_EQ(tr.find("Esc"), std::string::npos) << tr;  // templerun has no mouse
  EXPECT_NE(tr.find("jump"), std::string::npos) << tr;
  EXPECT_NE(tr.find("restart from frame 1"), std::string::npos) << tr;
  wv::ViewerOptions bad;
  bad.mode = "custom";
  EXPECT_THROW(wv::Mg2View{bad}, wm::Error);
}

// ---------------------------------------------------------------- Matrix-Game-2.0, no window

namespace {

wm::worldkv::Mg2Input keys_input(std::vector<float> keyboard) {
  wm::worldkv::Mg2Input in;
  in.keyboard = std::move(keyboard);
  return in;
}

std::vector<float> one_hot(int i, int n = 7) {
  std::vector<float> v(static_cast<size_t>(n), 0.f);
  v[static_cast<size_t>(i)] = 1.f;
  return v;
}

}  // namespace

TEST(ViewerMg2Input, UniversalKeysAreMultiHotAndTheMouseLooks) {
  using K = wv::Mg2Key;
  wv::Mg2InputState in("universal");  // 0.005 a pixel, cap 0.2 a frame, backlog 1.0
  in.press(K::W, 26);
  in.press(K::D, 7);
  auto a = in.sample();
  EXPECT_EQ(a.keyboard, (std::vector<float>{1, 0, 0, 1}));
  EXPECT_EQ(a.pitch, 0.f);
  EXPECT_EQ(a.yaw, 0.f);
  in.release(K::W, 26);
  in.release(K::D, 7);
  in.mouse_motion(20, -10);  // right and up
  a = in.sample();
  EXPECT_EQ(a.keyboard, (std::vector<float>{0, 0, 0, 0}));
  EXPECT_FLOAT_EQ(a.yaw, 0.1f);
  EXPECT_FLOAT_EQ(a.pitch, 0.05f);
  EXPECT_EQ(in.sample().yaw, 0.f);  // used up
  in.mouse_motion(100, 0);          // 0.5: capped at 0.2 a frame, the rest carried over
  EXPECT_FLOAT_EQ(in.sample().yaw, 0.2f);
  EXPECT_FLOAT_EQ(in.sample().yaw, 0.2f);
  EXPECT_FLOAT_EQ(in.sample().yaw, 0.1f);
  EXPECT_EQ(in.sample().yaw, 0.f);
  in.mouse_motion(-4000, 0);  // far beyond the backlog: -1.0 in all
  double sum = 0;
  for (int i = 0; i < 8; ++i) sum += in.sample().yaw;
  EXPECT_NEAR(sum, -1.0, 1e-6);
  in.press(K::Left, 80);  // arrows: 0.1 a frame, the mouse fills up to the cap beside them
  EXPECT_FLOAT_EQ(in.sample().yaw, -0.1f);
  in.mouse_motion(-100, 0);
  EXPECT_FLOAT_EQ(in.sample().yaw, -0.2f);
  in.release(K::Left, 80);
  in.clear();
  in.press(K::Up, 82);
  EXPECT_FLOAT_EQ(in.sample().pitch, 0.1f);
  in.release(K::Up, 82);
  in.press(K::S, 22);  // a tap between two samples counts once
  in.release(K::S, 22);
  EXPECT_EQ(in.sample().keyboard, (std::vector<float>{0, 1, 0, 0}));
  EXPECT_EQ(in.sample().keyboard, (std::vector<float>{0, 0, 0, 0}));
  in.press(K::Space, 44);  // not a key of universal
  in.press(K::Q, 20);
  a = in.sample();
  EXPECT_EQ(a.keyboard, (std::vector<float>{0, 0, 0, 0}));
  EXPECT_EQ(wv::format_mg2_keys(keys_input({1, 0, 0, 1}), in.keyboard_names()), "W . . D");
}

TEST(ViewerMg2Input, GtaSteersWithTheKeysAndTempleRunIsOneHot) {
  using K = wv::Mg2Key;
  wv::Mg2InputState g("gta_drive");
  g.press(K::W, 1);
  g.press(K::A, 2);
  auto a = g.sample();
  EXPECT_EQ(a.keyboard, (std::vector<float>{1, 0}));
  EXPECT_FLOAT_EQ(a.yaw, -0.1f);
  EXPECT_EQ(a.pitch, 0.f);
  g.release(K::A, 2);
  g.press(K::Right, 3);
  g.mouse_motion(500, 500);  // the mouse does not drive
  a = g.sample();
  EXPECT_FLOAT_EQ(a.yaw, 0.1f);
  EXPECT_EQ(a.pitch, 0.f);
  g.release(K::Right, 3);
  g.release(K::W, 1);
  g.press(K::Down, 4);
  EXPECT_EQ(g.sample().keyboard, (std::vector<float>{0, 1}));

  wv::Mg2InputState t("templerun");
  EXPECT_EQ(t.keyboard_dim(), 7);
  EXPECT_EQ(t.sample().keyboard, one_hot(0));  // nothing held: nomove
  t.press(K::Space, 1);
  EXPECT_EQ(t.sample().keyboard, one_hot(1));  // jump
  t.press(K::A, 2);
  EXPECT_EQ(t.sample().keyboard, one_hot(1));  // jump goes first
  t.release(K::Space, 1);
  EXPECT_EQ(t.sample().keyboard, one_hot(3));  // turnleft
  t.release(K::A, 2);
  t.press(K::E, 3);
  EXPECT_EQ(t.sample().keyboard, one_hot(6));  // rightside
  t.release(K::E, 3);
  t.press(K::Q, 4);
  EXPECT_EQ(t.sample().keyboard, one_hot(5));  // leftside
  t.release(K::Q, 4);
  t.press(K::S, 5);
  t.release(K::S, 5);
  EXPECT_EQ(t.sample().keyboard, one_hot(2));  // slide, tapped
  EXPECT_EQ(t.sample().keyboard, one_hot(0));
  t.press(K::Right, 6);
  EXPECT_EQ(wv::format_mg2_keys(t.sample(), t.keyboard_names()), "turnright");
  EXPECT_THROW(wv::Mg2InputState("custom"), wm::Error);
}

TEST(ViewerMg2, RecognisesModelsAndFindsTheHubsFilesBesideThem) {
  const fs::path fx = fs::path(WM_SOURCE_DIR) / "tests/dit/fixtures/mg2/universal";
  EXPECT_TRUE(wv::is_mg2_model((fx / "model.safetensors").string(), ""));
  EXPECT_TRUE(wv::is_mg2_model(fx.string(), ""));
  EXPECT_TRUE(wv::is_mg2_model("anything.safetensors", "universal"));
  EXPECT_FALSE(wv::is_mg2_model("", ""));
  EXPECT_FALSE(wv::is_mg2_model((fs::path(WM_SOURCE_DIR) / "assets/models/tiny/model.safetensors").string(), ""));
  // A config.json of something else beside a file does not make it Matrix-Game-2.0.
  const fs::path other = wm::testing::make_temp_dir("wm_viewer_mg2_");
  std::ofstream(other / "config.json") << R"({"_class_name": "LlamaForCausalLM"})";
  EXPECT_FALSE(wv::is_mg2_model((other / "model.safetensors").string(), ""));
  std::ofstream(other / "config.json") << "{not json";
  EXPECT_FALSE(wv::is_mg2_model((other / "model.safetensors").string(), ""));
  fs::remove_all(other);

  const std::string want = (fx.parent_path() / "Wan2.1_VAE.pth").lexically_normal().string();
  EXPECT_EQ(wm::rollout::mg2_file_beside_model((fx / "model.safetensors").string(), "", "Wan2.1_VAE.pth"), want);
  EXPECT_EQ(wm::rollout::mg2_file_beside_model(fx.string(), "", "Wan2.1_VAE.pth"), want);
  EXPECT_EQ(wm::rollout::mg2_file_beside_model(fx.string() + "/", "", "Wan2.1_VAE.pth"), want);
  EXPECT_EQ(wm::rollout::mg2_file_beside_model(fx.string(), "my.pth", "Wan2.1_VAE.pth"), "my.pth");
}

TEST(ViewerMg2, RollingWindowHoldsTheFramesUpstreamKeeps) {
  using V = std::vector<std::string>;
  EXPECT_EQ(wm::worldkv::mg2_rolling_window_chunks(0, 6, 3), V{});
  EXPECT_EQ(wm::worldkv::mg2_rolling_window_chunks(1, 6, 3), V{"chunk:0"});  // universal, templerun: 3 frames
  EXPECT_EQ(wm::worldkv::mg2_rolling_window_chunks(5, 6, 3), V{"chunk:4"});
  EXPECT_EQ(wm::worldkv::mg2_rolling_window_chunks(5, 4, 3), V{"chunk:4"});  // gta_drive: its last frame
  EXPECT_EQ(wm::worldkv::mg2_rolling_window_chunks(5, 15, 3), (V{"chunk:1", "chunk:2", "chunk:3", "chunk:4"}));
  EXPECT_EQ(wm::worldkv::mg2_rolling_window_chunks(2, 15, 3), (V{"chunk:0", "chunk:1"}));
}

// ---------------------------------------------------------------- the program under X

// A named namespace, not an anonymous one: in a unity batch the fixture would otherwise be a
// base of the tests with internal linkage (-Wsubobject-linkage).
namespace viewer_test {

std::string find_in_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "/usr/bin:/bin");
  for (std::string dir; std::getline(ss, dir, ':');) {
    const fs::path p = fs::path(dir) / name;
    if (!dir.empty() && ::access(p.c_str(), X_OK) == 0) return p.string();
  }
  return "";
}

// A display for the viewer: $DISPLAY when set, else an Xvfb started on a free number (killed
// by the destructor). skip_reason is set when neither is possible.
struct XDisplay {
  std::string display, skip_reason;
  pid_t xvfb = -1;

  XDisplay() {
    if (const char* d = std::getenv("DISPLAY"); d && *d) {
      display = d;
      return;
    }
    const std::string bin = find_in_path("Xvfb");
    if (bin.empty()) {
      skip_reason = "no DISPLAY and no Xvfb on PATH (install xvfb to run the viewer test headless)";
      return;
    }
    // -displayfd: Xvfb picks a free display number itself and writes it to the pipe when it is
    // ready, so parallel test processes cannot race for the same number.
    int fds[2];
    if (::pipe(fds) != 0) {
      skip_reason = "pipe() failed";
      return;
    }
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      const int null = ::open("/dev/null", O_RDWR);
      ::dup2(null, 0);
      ::dup2(null, 1);
      ::dup2(null, 2);
      const std::string fd = std::to_string(fds[1]);
      ::execl(bin.c_str(), "Xvfb", "-displayfd", fd.c_str(), "-screen", "0", "1280x800x24", "-nolisten", "tcp",
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(fds[1]);
    std::string num;
    if (pid > 0) {
      pollfd p{fds[0], POLLIN, 0};
      char c;
      while (::poll(&p, 1, 10000) > 0 && ::read(fds[0], &c, 1) == 1 && c != '\n') num += c;
    }
    ::close(fds[0]);
    if (pid > 0 && !num.empty()) {
      xvfb = pid;
      display = ":" + num;
    } else {
      if (pid > 0) {
        ::kill(pid, SIGTERM);
        ::waitpid(pid, nullptr, 0);
      }
      skip_reason = "Xvfb did not start (no display number reported within 10 s)";
    }
  }
  ~XDisplay() {
    if (xvfb > 0) {
      ::kill(xvfb, SIGTERM);
      ::waitpid(xvfb, nullptr, 0);
    }
  }
};

struct RunResult {
  int rc = -1;  // exit code; -1 killed on timeout or by a signal
  std::string output;
};

// Runs argv in `cwd` with DISPLAY set, stdout+stderr to a log; kills it after timeout_s.
RunResult run_program(const std::vector<std::string>& argv, const std::string& display, const fs::path& cwd,
                      double timeout_s) {
  const fs::path log = cwd / "viewer.log";
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::chdir(cwd.c_str()) != 0) ::_exit(126);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::setenv("DISPLAY", display.c_str(), 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  RunResult r;
  if (pid < 0) return r;
  const auto t0 = std::chrono::steady_clock::now();
  int st = 0;
  for (;;) {
    if (::waitpid(pid, &st, WNOHANG) == pid) {
      r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
      break;
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &st, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::ifstream f(log);
  std::stringstream ss;
  ss << f.rdbuf();
  r.output = ss.str();
  return r;
}

class ViewerProgram : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    x_ = new XDisplay();
    dir_ = wm::testing::make_temp_dir("wm_viewer_test_");
    // The embedded model when it is there, else random weights of the tiny config.
    const fs::path shipped = fs::path(WM_SOURCE_DIR) / "assets/models/tiny/model.safetensors";
    if (fs::exists(shipped)) {
      model_ = shipped.string();
    } else {
      model_ = (dir_ / "random_tiny.safetensors").string();
      wm::dit::CausalDit m(wm::dit::load_config(std::string(WM_SOURCE_DIR) + "/configs/tiny.json"));
      m->init_weights(7);
      wm::dit::save_weights(*m, model_);
    }
  }
  static void TearDownTestSuite() {
    delete x_;
    x_ = nullptr;
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  void SetUp() override {
    if (!x_->skip_reason.empty()) GTEST_SKIP() << x_->skip_reason;
  }
  // Runs the viewer with the common flags plus `extra`; returns its summary JSON (an empty
  // object after a failure: callers read it through a non-const json, where a missing key is null).
  nlohmann::json run_viewer(const std::vector<std::string>& extra, const std::string& name, RunResult* out = nullptr) {
    const fs::path summary = dir_ / (name + ".json");
    // Sanitized builds run several times slower: WM_TEST_TIME_SCALE (tools/sanitize.sh sets it)
    // stretches the viewer's own timeout and the wait for it alike.
    const char* scale_env = std::getenv("WM_TEST_TIME_SCALE");
    const int scale = scale_env != nullptr ? std::max(1, std::atoi(scale_env)) : 1;
    std::vector<std::string> argv{WM_VIEWER_BIN, "--model", model_, "--software", "--seed", "1", "--threads", "1",
                                  "--timeout", std::to_string(50 * scale), "--summary-json", summary.string()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    const RunResult r = run_program(argv, x_->display, dir_, 55 * scale);
    if (out) *out = r;
    EXPECT_EQ(r.rc, 0) << r.output;
    std::ifstream f(summary);
    if (!f) {
      ADD_FAILURE() << "no summary written; output:\n" << r.output;
      return nlohmann::json::object();
    }
    return nlohmann::json::parse(f);
  }

  static XDisplay* x_;
  static fs::path dir_;
  static std::string model_;
};

XDisplay* ViewerProgram::x_ = nullptr;
fs::path ViewerProgram::dir_;
std::string ViewerProgram::model_;

SDL_Rect rect_of(const nlohmann::json& a) { return SDL_Rect{a[0], a[1], a[2], a[3]}; }

// Distinct colours in a rectangle of the image.
size_t distinct_colors(const wm::Image& img, const SDL_Rect& r) {
  std::set<uint32_t> seen;
  for (int y = r.y; y < r.y + r.h; ++y)
    for (int x = r.x; x < r.x + r.w; ++x) {
      const uint8_t* p = img.pixel(x, y);
      seen.insert(uint32_t(p[0]) << 16 | uint32_t(p[1]) << 8 | p[2]);
    }
  return seen.size();
}

size_t count_color(const wm::Image& img, const SDL_Rect& r, SDL_Color c) {
  size_t n = 0;
  for (int y = r.y; y < r.y + r.h; ++y)
    for (int x = r.x; x < r.x + r.w; ++x) {
      const uint8_t* p = img.pixel(x, y);
      n += p[0] == c.r && p[1] == c.g && p[2] == c.b;
    }
  return n;
}

}  // namespace viewer_test

using namespace viewer_test;

TEST_F(ViewerProgram, InjectedInputSteersAndScreenshotShowsFrameAndHud) {
  const fs::path shot = dir_ / "shot.png";
  // W held for 4 chunks, then the mouse 240 px right (36 degrees), then G (ground truth beside).
  auto s = run_viewer({"--width", "1100", "--height", "660", "--screenshot", shot.string(), "--inject",
                             "wait 1c; hold W 4c; mouse 240 0; wait 3c; press G; wait 1c"},
                            "steer");
  ASSERT_TRUE(s.contains("start")) << s.dump();
  const double x0 = s["start"]["x"], y0 = s["start"]["y"], yaw0 = s["start"]["yaw_deg"];
  const double x1 = s["end"]["x"], y1 = s["end"]["y"], yaw1 = s["end"]["yaw_deg"];
  const double r = yaw0 * M_PI / 180.0;
  const double along = (x1 - x0) * std::cos(r) + (y1 - y0) * std::sin(r);
  EXPECT_GT(along, 0.5) << "W should move forward along the start heading " << s["start"].dump() << " -> "
                        << s["end"].dump();
  const double turned = wm::world::wrap_deg(yaw1 - yaw0);
  EXPECT_NEAR(turned, 36.0, 6.0) << "mouse 240 px right at 0.15 deg/px";
  EXPECT_GE(s["chunks"].get<int>(), 8);
  EXPECT_EQ(s["policy"], "worldkv");
  EXPECT_TRUE(s["ground_truth_shown"].get<bool>());

  ASSERT_TRUE(fs::exists(shot));
  const wm::Image img = wm::media::read_image(shot.string());
  EXPECT_EQ(img.width, 1100);
  EXPECT_EQ(img.height, 660);
  const SDL_Rect frame = rect_of(s["layout"]["frame"]), gt = rect_of(s["layout"]["gt"]), hud = rect_of(s["layout"]["hud"]);
  ASSERT_GT(frame.w, 0);
  ASSERT_LE(frame.x + frame.w, img.width);
  ASSERT_LE(frame.y + frame.h, img.height);
  EXPECT_GT(distinct_colors(img, frame), 20u) << "the model frame area is (nearly) uniform";
  ASSERT_GT(gt.w, 0);
  EXPECT_GT(distinct_colors(img, gt), 20u) << "the ground-truth area is (nearly) uniform";
  EXPECT_GT(count_color(img, hud, wv::palette::kText), 300u) << "no HUD text in the HUD area";
}

TEST_F(ViewerProgram, KeysSwitchPolicyRecordNewSceneAndQuit) {
  const fs::path rec = dir_ / "rec.mp4";
  // Recording from the start, 4 = worldkv_c, R stops the recording, N = next scene, P pause and
  // resume, H help, Q quits.
  auto s = run_viewer({"--record", rec.string(), "--inject",
                             "wait 1c; press 4; hold D 2c; press R; press N; wait 1c; press P; wait 200ms; "
                             "press P; press H; wait 1c; press Q; wait 10s"},
                            "keys");
  EXPECT_EQ(s["policy"], "worldkv_c");
  EXPECT_EQ(s["seed"], 2);
  ASSERT_EQ(s["recordings"].size(), 1u) << s.dump();
  EXPECT_TRUE(fs::exists(rec));
  EXPECT_GT(fs::file_size(rec), 1000u);
}

TEST_F(ViewerProgram, ExitsAfterChunksAndReportsErrors) {
  auto s = run_viewer({"--chunks", "3", "--fps", "0", "--policy", "sliding_window"}, "chunks");
  EXPECT_EQ(s["chunks"], 3);
  EXPECT_EQ(s["frames"], 9);
  EXPECT_GT(s["chunk_ms"]["p50"].get<double>(), 0.0);
  // A missing model is a clear error and a non-zero exit, before any window.
  const RunResult bad = run_program({WM_VIEWER_BIN, "--model", (dir_ / "missing.safetensors").string()}, x_->display,
                                    dir_, 30);
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(bad.output.find("not found"), std::string::npos) << bad.output;
}

// Matrix-Game-2.0 on the reduced universal model (tests/dit/fixtures/mg2), from random image
// latents and CLIP tokens, decoded by a 1-wide Wan VAE with random weights: the fixture's 4-wide
// one (wan_vae_tiny.pth, same code) costs about 1 s of CPU a 640x352 frame, this one a third of
// that. W held and the mouse 200 px right for both chunks: every one of the 9 + 12 frames' inputs
// carries W, the mouse turns 1.0 (0.2 a frame), and the retrieval pose follows.
namespace viewer_test {

// The reduced universal model's files for a run: random image latents and CLIP tokens, and a
// 1-wide random Wan VAE (written once).
struct Mg2Files {
  fs::path model, latents, vae;
};

Mg2Files mg2_files(const fs::path& dir) {
  Mg2Files f{fs::path(WM_SOURCE_DIR) / "tests/dit/fixtures/mg2/universal/model.safetensors",
             dir / "mg2_latents.safetensors", dir / "wan_vae_dim1.safetensors"};
  if (!fs::exists(f.vae)) {
    at::Generator g = at::detail::createCPUGenerator(3);
    wm::save_safetensors(f.latents.string(), {{"image_latents", at::randn({2, 16, 44, 80}, g)},
                                              {"clip_tokens", at::randn({257, 1280}, g)}});
    wm::save_safetensors(f.vae.string(), wm::bench::random_wan_vae(1, 4));
  }
  return f;
}

// Every key of a JSON object, nested ones as "a.b", sorted.
std::set<std::string> key_paths(const nlohmann::json& j, const std::string& prefix = "") {
  std::set<std::string> out;
  for (const auto& [k, v] : j.items()) {
    out.insert(prefix + k);
    if (v.is_object() && k != "keys")
      for (const auto& sub : key_paths(v, prefix + k + ".")) out.insert(sub);
  }
  return out;
}

// The summary's end pose after W held and the mouse 200 px right over the 9 + 12 frames of two
// chunks: yaw 0.2, 0.4, ... 1.0 then 1.0 (the turn first, then a step of 1 along it); the model's
// input is float32.
void expect_end_after_w_and_mouse_right(const nlohmann::json& s) {
  double x = 0, y = 0, yaw = 0;
  for (int i = 0; i < 21; ++i) {
    if (i < 5) yaw += double(0.2f);
    x += std::cos(yaw);
    y += std::sin(yaw);
  }
  const nlohmann::json& end = s.at("end");
  EXPECT_NEAR(end.at("x").get<double>(), x, 1e-4);
  EXPECT_NEAR(end.at("y").get<double>(), y, 1e-4);
  EXPECT_NEAR(end.at("yaw_deg").get<double>(), yaw * 180.0 / M_PI, 1e-6);
}

// Runs the viewer on the reduced model's files on the CPU (one thread: the suites run two at a
// time on two cores), software-rendered, the frame clock free, with `extra`, and reads the summary
// it wrote to `summary` (empty object when none). timeout_s is the viewer's own --timeout, stretched by WM_TEST_TIME_SCALE.
nlohmann::json run_mg2(const Mg2Files& f, std::vector<std::string> extra, const fs::path& summary,
                       const std::string& display, const fs::path& dir, int timeout_s, RunResult& r) {
  const char* scale_env = std::getenv("WM_TEST_TIME_SCALE");
  const int scale = scale_env != nullptr ? std::max(1, std::atoi(scale_env)) : 1;
  std::vector<std::string> argv{WM_VIEWER_BIN, "--model", f.model.string(), "--latents", f.latents.string(), "--vae",
                                f.vae.string(), "--device", "cpu", "--threads", "1", "--software", "--fps", "0",
                                "--timeout", std::to_string(timeout_s * scale), "--summary-json", summary.string()};
  argv.insert(argv.end(), extra.begin(), extra.end());
  r = run_program(argv, display, dir, (timeout_s + 10) * scale);
  std::ifstream in(summary);
  return in ? nlohmann::json::parse(in) : nlohmann::json::object();
}

}  // namespace viewer_test

// Matrix-Game-2.0 on the reduced universal model (tests/dit/fixtures/mg2), from random image
// latents and CLIP tokens, decoded by a 1-wide Wan VAE with random weights: the fixture's 4-wide
// one (wan_vae_tiny.pth, same code) costs about 1 s of CPU a 640x352 frame, this one a third of
// that. W held and the mouse 200 px right for both chunks: every one of the 9 + 12 frames' inputs
// carries W, the mouse turns 1.0 (0.2 a frame), and the retrieval pose follows. The summary has the
// tiny model's shape, key for key.
TEST_F(ViewerProgram, Mg2RunsTwoChunksOfTheReducedModelFromHeldKeys) {
  const Mg2Files files = mg2_files(dir_);
  const fs::path shot = dir_ / "mg2.png";
  RunResult r;
  nlohmann::json s = run_mg2(files, {"--chunks", "2", "--screenshot", shot.string(), "--inject", "down W; mouse 200 0; wait 2c; up W"},
                             dir_ / "mg2.json", x_->display, dir_, 100, r);
  ASSERT_EQ(r.rc, 0) << r.output;
  ASSERT_TRUE(s.contains("kind")) << r.output;
  EXPECT_EQ(s["kind"], "matrix-game-2.0");
  EXPECT_EQ(s["name"], "universal");
  EXPECT_EQ(s["chunks"], 2);
  EXPECT_EQ(s["frames"], 21);  // 9 + 12 decoded frames
  EXPECT_EQ(s["controls"], 21);
  EXPECT_EQ(s["policy"], "native");
  EXPECT_EQ(s["keys"], (nlohmann::json{{"W", 21}, {"S", 0}, {"A", 0}, {"D", 0}}));
  EXPECT_GT(s["window_bytes"].get<double>(), 0);
  EXPECT_GT(s["state_bytes"].get<double>(), 0);  // the action K/V in upstream's rolling cache
  EXPECT_GT(s["decode_ms_mean"].get<double>(), 0);
  expect_end_after_w_and_mouse_right(s);

  ASSERT_TRUE(fs::exists(shot)) << r.output;
  const wm::Image img = wm::media::read_image(shot.string());
  const SDL_Rect frame = rect_of(s["layout"]["frame"]), hud = rect_of(s["layout"]["hud"]);
  EXPECT_EQ(frame.w, 640);
  EXPECT_EQ(frame.h, 352);
  ASSERT_LE(frame.x + frame.w, img.width);
  ASSERT_LE(frame.y + frame.h, img.height);
  EXPECT_GT(distinct_colors(img, frame), 200u) << "the decoded frame is (nearly) uniform";
  EXPECT_GT(count_color(img, hud, wv::palette::kText), 300u) << "no HUD text in the HUD area";

  // One shape for both kinds: the tiny model's summary has the same keys.
  auto tiny = run_viewer({"--chunks", "1", "--fps", "0"}, "shape");
  EXPECT_EQ(tiny["kind"], "tiny_dit");
  EXPECT_EQ(key_paths(tiny), key_paths(s));
  EXPECT_EQ(tiny["keys"].size(), 5u);  // W S A D turn
}

// The shared loop's keys on Matrix-Game-2.0: a policy key restarts from the first frame under
// that policy (3: worldkv over the world memory), N restarts again, R records, H shows the help;
// every restart's first chunk takes 9 frames of input.
TEST_F(ViewerProgram, Mg2KeysSwitchPolicyRestartAndRecord) {
  const Mg2Files files = mg2_files(dir_);
  const fs::path rec = dir_ / "mg2.mp4";
  RunResult r;
  nlohmann::json s = run_mg2(files, {"--chunks", "3", "--record", rec.string(), "--inject",
                                     "wait 1c; press 3; wait 1c; press N; press H; wait 2c"},
                             dir_ / "mg2_keys.json", x_->display, dir_, 200, r);
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_EQ(s["policy"], "worldkv");
  EXPECT_EQ(s["chunks"], 3);
  EXPECT_EQ(s["controls"], 27);  // three first chunks: the start, after 3, after N
  EXPECT_EQ(s["frames"], 27);
  ASSERT_EQ(s["recordings"].size(), 1u) << s.dump();
  EXPECT_GT(fs::file_size(rec), 1000u);
  EXPECT_NE(r.output.find("wrote 27 frames"), std::string::npos) << r.output;
}

TEST_F(ViewerProgram, Mg2ErrorsComeBeforeTheWindow) {
  const fs::path model = fs::path(WM_SOURCE_DIR) / "tests/dit/fixtures/mg2/universal/model.safetensors";
  const fs::path lat = dir_ / "mg2_latents_err.safetensors";
  wm::save_safetensors(lat.string(), {{"image_latents", at::zeros({1, 16, 44, 80})}, {"clip_tokens", at::zeros({257, 1280})}});
  const std::vector<std::string> base{WM_VIEWER_BIN, "--model", model.string(), "--latents", lat.string(), "--device", "cpu"};
  auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = base;
    argv.insert(argv.end(), extra.begin(), extra.end());
    return run_program(argv, x_->display, dir_, 60);
  };
  const RunResult mode = run({"--mode", "gta_drive"});
  EXPECT_NE(mode.rc, 0);
  EXPECT_NE(mode.output.find("--mode gta_drive, but"), std::string::npos) << mode.output;
  EXPECT_NE(mode.output.find("is a universal model"), std::string::npos) << mode.output;
  // No --vae: the hub's file name beside the model folder, which the fixtures do not have.
  const RunResult vae = run({});
  EXPECT_NE(vae.rc, 0);
  EXPECT_NE(vae.output.find("no VAE at"), std::string::npos) << vae.output;
  EXPECT_NE(vae.output.find("Wan2.1_VAE.pth"), std::string::npos) << vae.output;
  const RunResult policy = run({"--policy", "lru", "--vae", "x.pth"});
  EXPECT_NE(policy.rc, 0);
  EXPECT_NE(policy.output.find("lru"), std::string::npos) << policy.output;
}


// LingBot-World-Fast in the viewer: a random folder of the tiny size as the hub lays it out
// (sharded, with its index) beside a 1-wide random Wan VAE and a random umT5 with the tokenizer
// fixture, started from an image at a 32 x 48 video and a --prompt. W held and the mouse 200 px right for both chunks: the camera pose integrates them as
// Matrix-Game-2.0's retrieval pose does, and it is the pose the session records.
namespace viewer_lingbot_test {

fs::path lingbot_folder(const fs::path& dir) {
  const fs::path model = dir / "lingbot" / "lingbot_world_fast";
  if (fs::exists(model)) return model;
  wm::dit::LingbotConfig c;
  c.model_type = "i2v";
  c.in_dim = 36;
  c.dim = 32;
  c.ffn_dim = 64;
  c.num_heads = 2;
  c.num_layers = 2;
  c.text_dim = 32;
  c.text_len = 16;
  wm::dit::LingbotDit m(c);
  at::Generator g = at::detail::createCPUGenerator(11);
  {
    at::NoGradGuard ng;
    for (auto& p : m->parameters()) p.normal_(0.0, 0.05, g);
  }
  wm::dit::save_lingbot_dit(*m, model.string(), 64 << 10);
  wm::save_safetensors((dir / "lingbot" / "Wan2.1_VAE.safetensors").string(), wm::bench::random_wan_vae(1, 4));
  // umT5 as the hub lays it out beside the model folder: an encoder as wide as text_dim, one row a
  // piece of the tokenizer fixture (300), and that tokenizer.
  wm::save_safetensors((dir / "lingbot" / "models_t5_umt5-xxl-enc-bf16.safetensors").string(),
                       wm::bench::random_umt5(wm::bench::small_umt5_config(32, 300), 12));
  fs::create_directories(dir / "lingbot" / "google" / "umt5-xxl");
  fs::copy_file(std::string(WM_SOURCE_DIR) + "/tests/dit/fixtures/lingbot/umt5_spiece.model",
                dir / "lingbot" / "google" / "umt5-xxl" / "spiece.model");
  wm::Image img(96, 64);
  for (int y = 0; y < 64; ++y)
    for (int x = 0; x < 96; ++x) img.pixel(x, y)[0] = uint8_t(2 * x), img.pixel(x, y)[1] = uint8_t(3 * y);
  wm::media::write_png((dir / "lingbot" / "start.png").string(), img);
  return model;
}

}  // namespace viewer_lingbot_test

TEST_F(ViewerProgram, LingbotRunsTwoChunksFromHeldKeysAsCameraPoses) {
  const fs::path model = viewer_lingbot_test::lingbot_folder(dir_);
  const fs::path summary = dir_ / "lingbot.json";
  std::vector<std::string> argv{WM_VIEWER_BIN, "--model", model.string(), "--image",
                                (model.parent_path() / "start.png").string(), "--size", "32*48", "--device",
                                "cpu", "--threads", "1", "--software", "--fps", "0", "--timeout", "100",
                                "--summary-json", summary.string(), "--chunks", "2", "--inject",
                                "down W; mouse 200 0; wait 2c; up W"};
  // The text through the folder's umT5 (when the build has the tokenizer).
  const bool prompt = wm::dit::umt5_tokenizer_available();
  if (prompt) argv.insert(argv.end(), {"--prompt", "a walk through a village"});
  const RunResult r = run_program(argv, x_->display, dir_, 110);
  ASSERT_EQ(r.rc, 0) << r.output;
  if (prompt) EXPECT_NE(r.output.find("wm_viewer: prompt: "), std::string::npos) << r.output;
  std::ifstream in(summary);
  ASSERT_TRUE(in) << r.output;
  const nlohmann::json s = nlohmann::json::parse(in);
  EXPECT_EQ(s["kind"], "lingbot-world-fast");
  EXPECT_EQ(s["policy"], "worldkv");
  EXPECT_EQ(s["chunks"], 2);
  EXPECT_EQ(s["frames"], 21);  // 9 + 12 decoded frames
  EXPECT_EQ(s["controls"], 21);
  EXPECT_EQ(s["keys"], (nlohmann::json{{"W", 21}, {"S", 0}, {"A", 0}, {"D", 0}}));
  expect_end_after_w_and_mouse_right(s);
  EXPECT_GT(s["window_bytes"].get<double>(), 0);
}

#endif  // WM_VIEWER_BIN
