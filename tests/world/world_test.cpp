// Tests of the procedural world: determinism, collision, revisit pairs, the suite JSON format.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <set>

#include "runtime/build_paths.h"
#include "runtime/error.h"
#include "tools/media/metrics.h"
#include "tools/world/actions.h"
#include "tools/world/raycaster.h"
#include "tools/world/revisits.h"
#include "tools/world/scene.h"
#include "tools/world/suite.h"
#include "tools/world/trajectory.h"

namespace {

using namespace wm::world;

// PSNR in dB, uncapped (infinity for identical images), as revisit_psnrs computes it.
using wm::media::psnr;

// A small suite shared by several tests (short trajectories keep the tests fast).
const Suite& small_suite() {
  static const Suite s = [] {
    SuiteOptions o;
    o.name = "test";
    o.trajectory.min_seconds = 10;
    o.trajectory.max_seconds = 20;
    return generate_suite(1234, 6, o);
  }();
  return s;
}

std::string expect_error(const std::string& text) {
  try {
    suite_from_json(text, "bad.json");
  } catch (const wm::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error for: " << text.substr(0, 200);
  return "";
}

std::string replace_once(std::string s, const std::string& from, const std::string& to) {
  size_t p = s.find(from);
  EXPECT_NE(p, std::string::npos) << from;
  if (p != std::string::npos) s.replace(p, from.size(), to);
  return s;
}

TEST(WorldScene, DeterministicBySeed) {
  for (uint64_t seed : {1ull, 2ull, 77ull}) {
    WorldParams p = random_world_params(seed);
    Scene a = generate_scene(p), b = generate_scene(p);
    EXPECT_EQ(a.solid, b.solid);
    EXPECT_EQ(a.landmark, b.landmark);
    ASSERT_EQ(a.textures.size(), b.textures.size());
    for (size_t i = 0; i < a.textures.size(); ++i) EXPECT_EQ(a.textures[i].rgb, b.textures[i].rgb);
    EXPECT_FALSE(a.free_cells().empty());
    EXPECT_GT(a.landmark_count(), 0);
    Raycaster ra(a), rb(b);
    auto c = a.free_cells()[a.free_cells().size() / 2];
    Pose pose{c.first + 0.5, c.second + 0.5, 30, 0};
    EXPECT_EQ(ra.render(pose).rgb, rb.render(pose).rgb);
  }
  // Different seeds give different worlds (layout or look).
  Scene a = generate_scene(random_world_params(1)), b = generate_scene(random_world_params(2));
  EXPECT_TRUE(a.solid != b.solid || a.textures[0].rgb != b.textures[0].rgb);
}

TEST(WorldScene, BadParamsNameTheField) {
  WorldParams p;
  p.width = 3;
  try {
    generate_scene(p);
    FAIL() << "no error";
  } catch (const wm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("width"), std::string::npos) << e.what();
  }
  p = WorldParams{};
  p.layout = "maze";
  EXPECT_THROW(generate_scene(p), wm::Error);
}

TEST(WorldRender, SizeAndFovAreConfigurable) {
  Scene s = generate_scene(random_world_params(5));
  auto c = s.free_cells().front();
  Pose pose{c.first + 0.5, c.second + 0.5, 0, 0};
  Raycaster r1(s, RenderSpec{96, 48, 70, 1});
  wm::Image im = r1.render(pose);
  EXPECT_EQ(im.width, 96);
  EXPECT_EQ(im.height, 48);
  Raycaster r2(s, RenderSpec{96, 48, 110, 1});
  EXPECT_NE(im.rgb, r2.render(pose).rgb);
  EXPECT_THROW(Raycaster(s, RenderSpec{64, 64, 200, 1}), wm::Error);
  // The image is not flat: walls, floor and ceiling differ.
  std::set<int> colours;
  for (size_t i = 0; i < im.rgb.size(); i += 3) colours.insert(im.rgb[i] << 16 | im.rgb[i + 1] << 8 | im.rgb[i + 2]);
  EXPECT_GT(colours.size(), 20u);
}

TEST(WorldMotion, WalkIntoWallStopsAtIt) {
  Scene s = generate_scene(random_world_params(3));
  MotionParams m;
  int tested = 0;
  for (auto c : s.free_cells()) {
    for (int d = 0; d < 4 && tested < 40; ++d) {
      const int dx[4] = {1, 0, -1, 0}, dy[4] = {0, 1, 0, -1};
      int run = 0;
      while (!s.is_solid(c.first + dx[d] * (run + 1), c.second + dy[d] * (run + 1))) ++run;
      Pose start{c.first + 0.5, c.second + 0.5, 90.0 * d, 0};
      Action w;
      w.forward = 1;
      int blocked = 0;
      auto poses = integrate(s, m, start, std::vector<Action>(static_cast<size_t>(run * 8 + 40), w), &blocked);
      const Pose& end = poses.back();
      // Stops `radius` before the wall face, never inside a wall.
      double wall_face_x = dx[d] > 0 ? c.first + run + 1.0 : c.first - run;
      double wall_face_y = dy[d] > 0 ? c.second + run + 1.0 : c.second - run;
      if (dx[d] != 0) EXPECT_NEAR(end.x, wall_face_x - dx[d] * m.radius, 1e-9);
      if (dy[d] != 0) EXPECT_NEAR(end.y, wall_face_y - dy[d] * m.radius, 1e-9);
      EXPECT_GT(blocked, 0);
      for (const Pose& p : poses) EXPECT_FALSE(s.is_solid(int(std::floor(p.x)), int(std::floor(p.y))));
      ++tested;
    }
    if (tested >= 40) break;
  }
  EXPECT_EQ(tested, 40);
}

TEST(WorldMotion, DiagonalWalkSlidesAndNeverEntersWalls) {
  Scene s = generate_scene(random_world_params(8));
  MotionParams m;
  auto c = s.free_cells()[7];
  Action a;
  a.forward = 1;
  a.strafe = 1;
  a.dyaw_deg = 3.0;
  auto poses = integrate(s, m, Pose{c.first + 0.5, c.second + 0.5, 10, 0}, std::vector<Action>(2000, a));
  for (const Pose& p : poses) {
    for (double ox : {-m.radius + 1e-9, m.radius - 1e-9})
      for (double oy : {-m.radius + 1e-9, m.radius - 1e-9})
        ASSERT_FALSE(s.is_solid(int(std::floor(p.x + ox)), int(std::floor(p.y + oy)))) << to_string(p);
  }
}

TEST(WorldMotion, KeysAndRuns) {
  Action a;
  parse_keys("WD", a);
  EXPECT_EQ(a.forward, 1);
  EXPECT_EQ(a.strafe, 1);
  EXPECT_EQ(keys_of(a), "WD");
  EXPECT_THROW(parse_keys("WS", a), wm::Error);
  EXPECT_THROW(parse_keys("Q", a), wm::Error);
  std::vector<Action> acts(5, a);
  acts.push_back(Action{});
  EXPECT_EQ(encode_runs(acts).size(), 2u);
  EXPECT_EQ(decode_runs(encode_runs(acts)), acts);
}

TEST(WorldTrajectory, DeterministicBySeed) {
  TrajectoryOptions o;
  o.min_seconds = 10;
  o.max_seconds = 15;
  Episode a = generate_episode(42, o), b = generate_episode(42, o), c = generate_episode(43, o);
  EXPECT_EQ(a.actions, b.actions);
  EXPECT_EQ(a.revisits, b.revisits);
  EXPECT_EQ(a.world.seed, b.world.seed);
  ASSERT_EQ(a.poses.size(), b.poses.size());
  for (size_t i = 0; i < a.poses.size(); ++i) {
    EXPECT_EQ(a.poses[i].x, b.poses[i].x);
    EXPECT_EQ(a.poses[i].yaw_deg, b.poses[i].yaw_deg);
  }
  EXPECT_TRUE(a.actions != c.actions || a.world.seed != c.world.seed);
}

// No plan with a revisit (the gap can never be met): the scene's generator says so after its
// attempts; the seed's tries four scenes and names the seed and the last scene's reason.
TEST(WorldTrajectory, NoRevisitNamesTheAttempts) {
  TrajectoryOptions o;
  o.min_seconds = 1;
  o.max_seconds = 1;
  o.max_attempts = 2;
  o.criteria.min_gap_frames = 1 << 20;
  const Scene scene = generate_scene(random_world_params(7));
  try {
    generate_episode(scene, 3, o);
    FAIL() << "no error";
  } catch (const wm::Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "no trajectory with a revisit after 2 attempts in scene seed " + std::to_string(scene.params.seed));
  }
  try {
    generate_episode(5, o);
    FAIL() << "no error";
  } catch (const wm::Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("generate_episode(seed 5): no trajectory with a revisit after 2 attempts", 0),
              0u)
        << e.what();
  }
}

TEST(WorldTrajectory, SuiteHasRealRevisits) {
  const Suite& s = small_suite();
  ASSERT_EQ(s.episodes.size(), 6u);
  for (const Episode& ep : s.episodes) {
    EXPECT_GE(ep.frames(), 160);
    EXPECT_LE(ep.frames(), 320);
    EXPECT_EQ(ep.frames() % 16, 0);
    ASSERT_FALSE(ep.revisits.empty()) << ep.name;
    Scene scene = scene_of(ep);
    Raycaster rc(scene, s.render);
    // Poses follow from the actions.
    auto poses = integrate(scene, ep.motion, ep.start, ep.actions);
    ASSERT_EQ(poses.size(), ep.poses.size());
    for (const RevisitPair& p : ep.revisits) {
      EXPECT_GE(p.revisit - p.first, 48);
      EXPECT_TRUE(is_revisit(ep.poses, p, s.criteria));
      EXPECT_GE(psnr(rc.render(ep.poses[p.first]), rc.render(ep.poses[p.revisit])), 30.0) << ep.name << " " << p.first << "->" << p.revisit;
    }
    // The revisit is a real change of view in between: some frame between differs a lot.
    const RevisitPair& p = ep.revisits.front();
    double worst = std::numeric_limits<double>::infinity();
    for (int k = p.first + 1; k < p.revisit; k += 4) worst = std::min(worst, psnr(rc.render(ep.poses[p.first]), rc.render(ep.poses[k])));
    EXPECT_LT(worst, 20.0) << ep.name;
  }
}

// revisit_psnrs is the uncapped PSNR of the two renders of each pair: +infinity for the suite's
// pairs (walks on cell centres and dyadic turns land on the very same pose), the renders' own
// PSNR for a pair whose views differ, and wm::Error for a pair out of range.
TEST(WorldTrajectory, RevisitPsnrsAreThePairsRenderPsnr) {
  const Suite& s = small_suite();
  Episode ep = s.episodes.front();
  const Scene scene = scene_of(ep);
  Raycaster rc(scene, s.render);
  const std::vector<double> got = revisit_psnrs(ep, scene, s.render);
  ASSERT_EQ(got.size(), ep.revisits.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const RevisitPair& p = ep.revisits[i];
    EXPECT_EQ(got[i], psnr(rc.render(ep.poses[p.first]), rc.render(ep.poses[p.revisit])));
    EXPECT_EQ(got[i], std::numeric_limits<double>::infinity()) << p.first << "->" << p.revisit;
  }
  // A pair whose second frame shows another view: the finite PSNR of those two renders.
  const RevisitPair p = ep.revisits.front();
  int away = p.first + 1;
  while (away < p.revisit && rc.render(ep.poses[away]).rgb == rc.render(ep.poses[p.first]).rgb) ++away;
  ASSERT_LT(away, p.revisit);
  ep.revisits = {{p.first, away}};
  const double want = psnr(rc.render(ep.poses[p.first]), rc.render(ep.poses[away]));
  EXPECT_TRUE(std::isfinite(want));
  EXPECT_EQ(revisit_psnrs(ep, scene, s.render), std::vector<double>{want});
  ep.revisits = {{p.first, static_cast<int>(ep.poses.size())}};
  EXPECT_THROW(revisit_psnrs(ep, scene, s.render), wm::Error);
}

TEST(WorldTrajectory, DetectsRevisitsOnlyAfterLookingAway) {
  std::vector<Pose> still(100, Pose{2.5, 2.5, 0, 0});
  RevisitCriteria c;
  EXPECT_TRUE(detect_revisits(still, c).empty());  // never looked away
  std::vector<Pose> sweep;
  for (int i = 0; i <= 30; ++i) sweep.push_back(Pose{2.5, 2.5, wrap_deg(6.0 * i), 0});
  for (int i = 30; i >= 0; --i) sweep.push_back(Pose{2.5, 2.5, wrap_deg(6.0 * i), 0});
  auto r = detect_revisits(sweep, c);
  ASSERT_FALSE(r.empty());
  EXPECT_EQ(r.back().first, 0);
  EXPECT_EQ(r.back().revisit, 61);
  for (auto& p : r) EXPECT_GE(p.revisit - p.first, 48);
}

TEST(WorldSuite, JsonRoundTrip) {
  const Suite& s = small_suite();
  std::string text = suite_to_json(s);
  Suite b = suite_from_json(text, "mem.json");
  EXPECT_EQ(b.name, s.name);
  EXPECT_EQ(b.fps, 16);
  EXPECT_EQ(b.render.width, s.render.width);
  EXPECT_EQ(b.criteria.min_gap_frames, 48);
  ASSERT_EQ(b.episodes.size(), s.episodes.size());
  for (size_t i = 0; i < s.episodes.size(); ++i) {
    const Episode &x = s.episodes[i], &y = b.episodes[i];
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.world.seed, y.world.seed);
    EXPECT_EQ(x.world.layout, y.world.layout);
    EXPECT_EQ(x.world.pillars, y.world.pillars);
    EXPECT_EQ(x.actions, y.actions);
    EXPECT_EQ(x.revisits, y.revisits);
    ASSERT_EQ(x.poses.size(), y.poses.size());
    for (size_t t = 0; t < x.poses.size(); ++t) {
      EXPECT_EQ(x.poses[t].x, y.poses[t].x);
      EXPECT_EQ(x.poses[t].yaw_deg, y.poses[t].yaw_deg);
    }
    ASSERT_EQ(x.segments.size(), y.segments.size());
  }
  EXPECT_EQ(suite_to_json(b), text);  // stable
  // Without stored poses it still loads (poses are derived).
  SaveOptions no_poses;
  no_poses.pose_every = 0;
  Suite c = suite_from_json(suite_to_json(s, no_poses), "mem.json");
  EXPECT_EQ(c.episodes[0].poses.size(), s.episodes[0].poses.size());
}

TEST(WorldSuite, LoadOrGenerate) {
  Suite a = load_or_generate_suite("gen:5:2");
  EXPECT_EQ(a.episodes.size(), 2u);
  EXPECT_EQ(a.source, "gen:5:2");
  Suite b = load_or_generate_suite("gen:5:2");
  EXPECT_EQ(a.episodes[1].actions, b.episodes[1].actions);
  EXPECT_THROW(load_or_generate_suite("gen:5"), wm::Error);
  EXPECT_THROW(load_or_generate_suite("gen:x:2"), wm::Error);
  EXPECT_THROW(load_or_generate_suite("gen:5:0"), wm::Error);
  try {
    load_or_generate_suite("/nonexistent/suite.json");
    FAIL();
  } catch (const wm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/suite.json"), std::string::npos);
  }
}

TEST(WorldSuite, BadJsonGivesClearErrors) {
  std::string good = suite_to_json(small_suite());
  auto has = [](const std::string& msg, const std::string& part) {
    EXPECT_NE(msg.find(part), std::string::npos) << "message: " << msg << "\nexpected to contain: " << part;
  };
  std::string e = expect_error("{\"format\": ");
  has(e, "bad.json");
  has(e, "not valid JSON");
  // A number out of a double's range is the JSON library's out_of_range, not a parse error
  // (found by fuzz_suite): still the reader's error, never an escaping exception.
  e = expect_error("{\"fps\": 1E99999}");
  has(e, "bad.json");
  has(e, "not valid JSON");
  e = expect_error(replace_once(good, "\"wm.world.suite\"", "\"other\""));
  has(e, "format");
  e = expect_error(replace_once(good, "\"fps\": 16", "\"fps\": \"16\""));
  has(e, "bad.json: fps: expected an integer, got string");
  e = expect_error(replace_once(good, "\"layout\":\"", "\"layoutX\":\""));
  has(e, "episodes[0].world: missing field \"layout\"");
  e = expect_error(replace_once(good, "\"actions\": [[", "\"actions\": [[0,\"Q\",0],["));
  has(e, "episodes[0].actions[0][0]: expected an integer in [1");
  e = expect_error(replace_once(good, "\"actions\": [[", "\"actions\": [[1,\"Q\",0],["));
  has(e, "episodes[0].actions[0][1]");
  e = expect_error(replace_once(good, "\"revisits\": [[", "\"revisits\": [[0,1],["));
  has(e, "episodes[0].revisits[0]: frames 0 and 1 are not a revisit");
  e = expect_error(replace_once(good, "\"pos_tol\":0.02", "\"pos_tol\":5"));
  has(e, "revisit.pos_tol: expected a number in [0");
  // A stored pose that the actions do not give.
  size_t p = good.find("\"values\": [[");
  ASSERT_NE(p, std::string::npos);
  std::string tampered = good;
  tampered.insert(p + 12, "9");
  e = expect_error(tampered);
  has(e, "episodes[0].poses.values[0]: stored pose");
  // A file that is not there.
  try {
    load_suite("/tmp/definitely-not-here.json");
    FAIL();
  } catch (const wm::Error& err) {
    has(err.what(), "/tmp/definitely-not-here.json: cannot open");
  }
}

TEST(WorldSuite, ShippedSuiteLoadsAndRevisitsAreReal) {
  std::string path = std::string(WM_SOURCE_DIR) + "/assets/suites/revisit60.json";
  std::ifstream probe(path);
  if (!probe) GTEST_SKIP() << path << " not present";
  Suite s = load_suite(path);  // verifies stored poses and every pair against the criteria
  ASSERT_EQ(s.episodes.size(), 60u);
  std::set<std::string> layouts;
  for (size_t i = 0; i < s.episodes.size(); ++i) {
    const Episode& ep = s.episodes[i];
    layouts.insert(ep.world.layout);
    EXPECT_GE(ep.frames(), 160);
    EXPECT_LE(ep.frames(), 960);
    ASSERT_FALSE(ep.revisits.empty()) << ep.name;
    // Render-check a sample of the pairs (all pairs are checked by wm_make_suite).
    Scene scene = scene_of(ep);
    Raycaster rc(scene, s.render);
    for (size_t k = 0; k < ep.revisits.size(); k += std::max<size_t>(1, ep.revisits.size() / 3)) {
      const RevisitPair& p = ep.revisits[k];
      EXPECT_GE(psnr(rc.render(ep.poses[p.first]), rc.render(ep.poses[p.revisit])), 30.0) << ep.name;
    }
  }
  EXPECT_EQ(layouts.size(), 2u);
}

}  // namespace
