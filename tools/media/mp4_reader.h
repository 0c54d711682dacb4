#pragma once
// Video decoding to wm::Image frames with libavformat/libavcodec/swscale: any container and
// codec the linked FFmpeg reads (MP4/H.264 from Mp4Writer among them).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dit/image.h"
#include "runtime/error.h"

namespace wm::media {

// Reads the best video stream of a file frame by frame, converting each to RGB8.
class VideoReader {
 public:
  // Opens `path` and its decoder. Throws wm::Error naming the path when the file cannot be
  // opened, has no video stream, or its codec is unsupported.
  explicit VideoReader(const std::string& path);
  ~VideoReader();
  VideoReader(VideoReader&&) noexcept;
  VideoReader& operator=(VideoReader&&) noexcept;
  VideoReader(const VideoReader&) = delete;
  VideoReader& operator=(const VideoReader&) = delete;

  // Decodes the next frame into *frame (RGB8, [height, width, 3]); false at the end of the
  // stream (then *frame is untouched). Throws wm::Error on a decoding failure.
  bool read(wm::Image* frame);
  // Decodes every remaining frame (the whole video when called first). Memory: all frames.
  std::vector<wm::Image> read_all();

  int width() const;
  int height() const;
  // Frame rate as a fraction (the stream's average rate, else its base rate); 0/1 if unknown.
  int fps_num() const;
  int fps_den() const;
  double fps() const;
  // Frame count the container declares (MP4 does), or -1 when it does not say.
  int64_t frame_count() const;
  // Frames returned by read() so far.
  int64_t frames_read() const;
  // Name of the decoder in use, e.g. "h264".
  std::string codec_name() const;
  const std::string& path() const;

  // Decodes the whole file and counts its frames (exact, unlike frame_count()).
  static int64_t count_frames(const std::string& path);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace wm::media
