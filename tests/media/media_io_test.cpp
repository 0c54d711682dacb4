// MP4 writer/reader round trips, PNG round trips, and the errors bad inputs must raise.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

#include "tests/temp_dir.h"
#include "tools/media/metrics.h"
#include "tools/media/mp4_reader.h"
#include "tools/media/mp4_writer.h"
#include "tools/media/png.h"
#include "tools/media/upscale.h"

namespace fs = std::filesystem;
using wm::Image;

namespace {

// A fresh directory of its own (mkdtemp) under the system temp dir, removed at the end of the test.
class TempDir {
 public:
  TempDir() : path_(wm::testing::make_temp_dir("wm_media_test_")) {}
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

// Frame t of a smooth moving pattern: gradients plus a bright square sliding right.
Image pattern(int w, int h, int t) {
  Image img(w, h);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      uint8_t* p = img.pixel(x, y);
      p[0] = static_cast<uint8_t>((x * 255) / std::max(1, w - 1));
      p[1] = static_cast<uint8_t>((y * 255) / std::max(1, h - 1));
      p[2] = static_cast<uint8_t>((t * 10) % 256);
      const int sx = (t * 2) % w, sy = h / 3;
      if (x >= sx && x < sx + w / 4 && y >= sy && y < sy + h / 4) p[0] = p[1] = p[2] = 230;
    }
  }
  return img;
}

// Nearest-neighbour upscale by s, padded to even size by repeating the last column/row.
Image upscale_even(const Image& in, int s) {
  const int ow = (in.width * s + 1) & ~1, oh = (in.height * s + 1) & ~1;
  Image out(ow, oh);
  for (int y = 0; y < oh; ++y)
    for (int x = 0; x < ow; ++x) {
      const int sx = std::min(x / s, in.width - 1), sy = std::min(y / s, in.height - 1);
      const uint8_t* p = in.pixel(sx, sy);
      std::copy(p, p + 3, out.pixel(x, y));
    }
  return out;
}

std::string what_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no exception>";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(Mp4, RoundTripFramesSizeRateAndQuality) {
  TempDir dir;
  const std::string path = dir.file("round.mp4");
  const int w = 64, h = 48, n = 24, fps = 12, up = 2;
  std::vector<Image> frames;
  {
    wm::media::Mp4Writer writer(path, w, h, fps, up);
    EXPECT_EQ(writer.out_width(), 128);
    EXPECT_EQ(writer.out_height(), 96);
    for (int t = 0; t < n; ++t) {
      frames.push_back(pattern(w, h, t));
      writer.write(frames.back());
    }
    EXPECT_EQ(writer.frames_written(), n);
    writer.close();
  }
  wm::media::VideoReader reader(path);
  EXPECT_EQ(reader.width(), w * up);
  EXPECT_EQ(reader.height(), h * up);
  EXPECT_EQ(reader.fps_num(), fps);
  EXPECT_EQ(reader.fps_den(), 1);
  EXPECT_EQ(reader.frame_count(), n);
  EXPECT_EQ(reader.codec_name(), "h264");
  std::vector<Image> decoded = reader.read_all();
  ASSERT_EQ(static_cast<int>(decoded.size()), n);
  double worst = 1e9;
  for (int t = 0; t < n; ++t) {
    ASSERT_EQ(decoded[t].width, w * up);
    ASSERT_EQ(decoded[t].height, h * up);
    const double p = wm::media::psnr(upscale_even(frames[t], up), decoded[t]);
    worst = std::min(worst, p);
  }
  EXPECT_GT(worst, 30.0) << "worst frame PSNR " << worst << " dB";
  // A second read of the file counts frames by decoding.
  EXPECT_EQ(wm::media::VideoReader::count_frames(path), n);
}

TEST(Mp4, OddSizesArePaddedToEven) {
  TempDir dir;
  for (auto [w, h, up] : {std::tuple{33, 17, 1}, std::tuple{33, 21, 3}, std::tuple{16, 16, 1}}) {
    const std::string path = dir.file("odd_" + std::to_string(w) + "_" + std::to_string(up) + ".mp4");
    {
      wm::media::Mp4Writer writer(path, w, h, 10, up);
      for (int t = 0; t < 5; ++t) writer.write(pattern(w, h, t));
      writer.close();  // the commit: without it the destructor removes the file
    }
    wm::media::VideoReader reader(path);
    EXPECT_EQ(reader.width(), (w * up + 1) & ~1);
    EXPECT_EQ(reader.height(), (h * up + 1) & ~1);
    std::vector<Image> decoded = reader.read_all();
    ASSERT_EQ(decoded.size(), 5u);
    EXPECT_GT(wm::media::psnr(upscale_even(pattern(w, h, 4), up), decoded[4]), 28.0) << w << "x" << h;
  }
}

TEST(Mp4, ClearErrors) {
  TempDir dir;
  // Unwritable path: the message names it.
  const std::string bad = "/nonexistent_dir_wm/sub/out.mp4";
  std::string msg = what_of([&] { wm::media::Mp4Writer w(bad, 16, 16, 10); });
  EXPECT_TRUE(contains(msg, bad)) << msg;
  // Bad parameters.
  msg = what_of([&] { wm::media::Mp4Writer w(dir.file("a.mp4"), 16, 16, 0); });
  EXPECT_TRUE(contains(msg, "positive")) << msg;
  // Wrong frame size mid-stream, then write after close.
  wm::media::Mp4Writer writer(dir.file("b.mp4"), 32, 32, 10, 1);
  writer.write(pattern(32, 32, 0));
  msg = what_of([&] { writer.write(pattern(32, 30, 1)); });
  EXPECT_TRUE(contains(msg, "32x30")) << msg;
  EXPECT_TRUE(contains(msg, "expected 32x32")) << msg;
  writer.write(pattern(32, 32, 1));  // still usable after the rejected frame
  writer.close();
  writer.close();  // idempotent
  EXPECT_EQ(writer.frames_written(), 2);
  msg = what_of([&] { writer.write(pattern(32, 32, 2)); });
  EXPECT_TRUE(contains(msg, "close")) << msg;
  EXPECT_EQ(wm::media::VideoReader::count_frames(dir.file("b.mp4")), 2);
}

// upscale_into (the writer's upscale, and the programs' side-by-side canvases): each pixel an
// s x s block at the offset, the rest of the canvas untouched; a block that does not fit throws.
TEST(Mp4, UpscaleIntoPlacesBlocksAtTheOffset) {
  const Image src = pattern(5, 3, 2);
  Image canvas(20, 12);
  for (auto& b : canvas.rgb) b = 7;
  wm::media::upscale_into(src, 3, canvas, 4, 2);
  for (int y = 0; y < canvas.height; ++y)
    for (int x = 0; x < canvas.width; ++x) {
      const bool inside = x >= 4 && x < 4 + 15 && y >= 2 && y < 2 + 9;
      const uint8_t* q = canvas.pixel(x, y);
      for (int c = 0; c < 3; ++c) {
        const int want = inside ? src.pixel((x - 4) / 3, (y - 2) / 3)[c] : 7;
        ASSERT_EQ(q[c], want) << x << "," << y << " channel " << c;
      }
    }
  std::string msg = what_of([&] { wm::media::upscale_into(src, 3, canvas, 6, 2); });
  EXPECT_TRUE(contains(msg, "does not fit in 20x12")) << msg;
  msg = what_of([&] { wm::media::upscale_into(src, 0, canvas); });
  EXPECT_TRUE(contains(msg, "scale")) << msg;
}

TEST(VideoReaderTest, ClearErrors) {
  TempDir dir;
  std::string msg = what_of([&] { wm::media::VideoReader r(dir.file("missing.mp4")); });
  EXPECT_TRUE(contains(msg, "missing.mp4")) << msg;
  const std::string junk = dir.file("junk.mp4");
  std::ofstream(junk) << "this is not a video file";
  msg = what_of([&] { wm::media::VideoReader r(junk); });
  EXPECT_TRUE(contains(msg, "junk.mp4")) << msg;
}

TEST(Png, RoundTripIsExact) {
  TempDir dir;
  for (auto [w, h] : {std::pair{1, 1}, std::pair{17, 9}, std::pair{64, 64}}) {
    Image img(w, h);
    for (size_t i = 0; i < img.rgb.size(); ++i) img.rgb[i] = static_cast<uint8_t>((i * 37 + 11) % 256);
    const std::string path = dir.file("img_" + std::to_string(w) + ".png");
    wm::media::write_png(path, img);
    Image back = wm::media::read_image(path);
    EXPECT_EQ(back.width, w);
    EXPECT_EQ(back.height, h);
    EXPECT_EQ(back.rgb, img.rgb) << w << "x" << h;  // RGB order kept (no BGR swap leaks out)
  }
  // Red stays red: catches a channel swap that a symmetric pattern could hide.
  Image red(2, 2);
  for (int i = 0; i < 4; ++i) red.rgb[i * 3] = 255;
  wm::media::write_png(dir.file("red.png"), red);
  EXPECT_EQ(wm::media::read_image(dir.file("red.png")).rgb, red.rgb);
}

TEST(Png, SequenceWriterNamesFrames) {
  TempDir dir;
  wm::media::PngSequenceWriter seq(dir.file("seq/nested"));
  for (int t = 0; t < 3; ++t) seq.write(pattern(20, 10, t));
  EXPECT_EQ(seq.frames_written(), 3);
  for (int t = 0; t < 3; ++t) {
    const std::string p = dir.file("seq/nested/frame_0000" + std::to_string(t) + ".png");
    ASSERT_TRUE(fs::exists(p)) << p;
    EXPECT_EQ(wm::media::read_image(p).rgb, pattern(20, 10, t).rgb);
  }
  EXPECT_TRUE(contains(what_of([&] { wm::media::PngSequenceWriter s(dir.file("x"), "frame.png"); }), "frame.png"));
  EXPECT_TRUE(contains(what_of([&] { wm::media::PngSequenceWriter s(dir.file("x"), "f_%s.png"); }), "f_%s.png"));
}

TEST(Png, ClearErrors) {
  TempDir dir;
  std::string msg = what_of([&] { wm::media::read_image(dir.file("nope.png")); });
  EXPECT_TRUE(contains(msg, "nope.png") && contains(msg, "no such file")) << msg;
  const std::string junk = dir.file("junk.png");
  std::ofstream(junk) << "not a png";
  msg = what_of([&] { wm::media::read_image(junk); });
  EXPECT_TRUE(contains(msg, "junk.png") && contains(msg, "decode")) << msg;
  msg = what_of([&] { wm::media::write_png("/nonexistent_dir_wm/x.png", Image(4, 4)); });
  EXPECT_TRUE(contains(msg, "/nonexistent_dir_wm/x.png")) << msg;
  msg = what_of([&] { wm::media::write_png(dir.file("e.png"), Image()); });
  EXPECT_TRUE(contains(msg, "empty")) << msg;
  EXPECT_TRUE(wm::media::is_image_path("a/B.PNG"));
  EXPECT_FALSE(wm::media::is_image_path("a/b.mp4"));
}
