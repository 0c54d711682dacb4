#pragma once
// Streaming H.264 MP4 writer: frames are encoded and muxed as they arrive, never buffered whole.
#include <memory>
#include <string>

#include "dit/image.h"
#include "runtime/error.h"

namespace wm::media {

// Writes wm::Image frames to an MP4 file (H.264, yuv420p, constant frame rate).
// Each input frame is scaled up by an integer factor with nearest-neighbour sampling (so 64x64
// frames become watchable at upscale 8). yuv420p needs even dimensions: when width*upscale or
// height*upscale is odd, the frame is padded by one column/row that repeats the last one, so
// the file's size is the scaled size rounded up to even (see out_width()/out_height()).
// Encoder: libx264 when the linked libavcodec has it, else the first other H.264 encoder that
// opens; if none opens, the constructor throws wm::Error naming what it tried.
// Whole or absent: the file is written under the temporary name `<folder>/.<name>.<pid>.part`
// (tools/cli/output_file.h, registered for removal on a termination signal) and renamed to its
// final name only by a successful close(). A writer destroyed without close() (an exception, a
// failed run) removes the temporary file: nothing ever appears under the final name unfinished.
class Mp4Writer {
 public:
  // Opens the temporary file of `path` for writing (container from the extension of `path`,
  // MP4 when it has none). Throws wm::Error with the path and FFmpeg's message on a bad path or
  // encoder failure, and on width/height/fps/upscale <= 0.
  Mp4Writer(const std::string& path, int width, int height, int fps, int upscale = 1);
  // Encodes one frame [height, width, 3] RGB8. Throws wm::Error when the frame's size differs
  // from the one given at construction (expected vs got) or after finish()/close().
  void write(const wm::Image& frame);
  // Flushes the encoder and writes the trailer; the file stays under its temporary name (for a
  // program that commits several outputs together). Idempotent. Throws on a write failure (the
  // temporary file is then removed).
  void finish();
  // finish(), then renames the file to its final name: the commit. Idempotent. Throws on a
  // write or rename failure (nothing is left under either name then).
  void close();
  // Without a successful close(): removes the temporary file. Never throws.
  ~Mp4Writer();

  Mp4Writer(const Mp4Writer&) = delete;
  Mp4Writer& operator=(const Mp4Writer&) = delete;
  Mp4Writer(Mp4Writer&&) noexcept;
  // Discards this writer's file unless it was closed (as the destructor does), then takes over.
  Mp4Writer& operator=(Mp4Writer&&) noexcept;

  // Number of frames passed to write() so far.
  int frames_written() const;
  // Size of the encoded video: input size * upscale, rounded up to even.
  int out_width() const;
  int out_height() const;
  // Name of the FFmpeg encoder in use, e.g. "libx264".
  std::string encoder_name() const;
  // The final path, and where the frames go until close() (the temporary name).
  std::string path() const;
  std::string temporary_path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace wm::media
