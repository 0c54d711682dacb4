#pragma once
// Still images: PNG output (lossless, exact round trip) and reading any format OpenCV decodes.
#include <string>

#include "dit/image.h"
#include "runtime/error.h"

namespace wm::media {

// Writes `image` as an 8-bit RGB PNG at `path` (whatever its extension). Throws wm::Error
// naming the path on an empty image or when the file cannot be written.
void write_png(const std::string& path, const wm::Image& image);

// Reads an image file (PNG, JPEG, BMP, ... anything OpenCV imgcodecs decodes) as RGB8; grey and
// alpha images are converted to RGB, 16-bit ones scaled to 8 bits. Throws wm::Error naming the
// path when it is missing or cannot be decoded.
wm::Image read_image(const std::string& path);

// True when the path's extension is one read_image is meant for (.png .jpg .jpeg .bmp .tif
// .tiff .webp .ppm .pgm .pnm), case-insensitive.
bool is_image_path(const std::string& path);

// Writes a numbered PNG sequence into a directory: dir/frame_00000.png, dir/frame_00001.png...
class PngSequenceWriter {
 public:
  // Creates `dir` (and parents) if needed. `pattern` is a printf pattern with exactly one
  // integer conversion (%d, %05d, ...) and no other '%'. Throws wm::Error naming the
  // directory or pattern when either is unusable.
  explicit PngSequenceWriter(const std::string& dir, const std::string& pattern = "frame_%05d.png",
                             int first_index = 0);
  // Writes the next frame; returns its path. Throws wm::Error as write_png does.
  std::string write(const wm::Image& frame);
  // Path the frame with the given index has (or will have).
  std::string path_for(int index) const;
  int frames_written() const { return written_; }

 private:
  std::string dir_;
  std::string pattern_;
  int next_;
  int written_ = 0;
};

}  // namespace wm::media
