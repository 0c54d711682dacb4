#include "tools/media/png.h"

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <vector>

namespace wm::media {

namespace fs = std::filesystem;

void write_png(const std::string& path, const wm::Image& image) {
  if (image.empty() || image.width <= 0 || image.height <= 0 ||
      image.rgb.size() != static_cast<size_t>(image.width) * image.height * 3) {
    throw wm::Error("write_png(" + path + "): image is empty or inconsistent (" + std::to_string(image.width) +
                    "x" + std::to_string(image.height) + ", " + std::to_string(image.rgb.size()) + " bytes)");
  }
  cv::Mat rgb(image.height, image.width, CV_8UC3, const_cast<uint8_t*>(image.rgb.data()));
  cv::Mat bgr;
  cv::cvtColor(rgb, bgr, cv::COLOR_RGB2BGR);
  std::vector<uchar> bytes;
  try {
    if (!cv::imencode(".png", bgr, bytes)) throw wm::Error("write_png(" + path + "): PNG encoding failed");
  } catch (const cv::Exception& e) {
    throw wm::Error("write_png(" + path + "): PNG encoding failed: " + e.what());
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw wm::Error("write_png(" + path + "): cannot open for writing: " + std::strerror(errno));
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) throw wm::Error("write_png(" + path + "): write failed: " + std::strerror(errno));
}

wm::Image read_image(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw wm::Error("read_image(" + path + "): no such file");
  if (fs::is_directory(path, ec)) throw wm::Error("read_image(" + path + "): is a directory, not an image");
  cv::Mat bgr;
  try {
    bgr = cv::imread(path, cv::IMREAD_COLOR);
  } catch (const cv::Exception& e) {
    throw wm::Error("read_image(" + path + "): cannot decode: " + e.what());
  }
  if (bgr.empty()) throw wm::Error("read_image(" + path + "): cannot decode (not an image OpenCV reads)");
  if (bgr.depth() != CV_8U) {
    cv::Mat tmp;
    bgr.convertTo(tmp, CV_8U, bgr.depth() == CV_16U ? 1.0 / 257.0 : 1.0);
    bgr = tmp;
  }
  wm::Image img(bgr.cols, bgr.rows);
  cv::Mat rgb(img.height, img.width, CV_8UC3, img.rgb.data());
  cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);  // writes into img.rgb (same size and type)
  return img;
}

bool is_image_path(const std::string& path) {
  std::string ext = fs::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  static const char* kExt[] = {".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pnm"};
  for (const char* e : kExt) {
    if (ext == e) return true;
  }
  return false;
}

namespace {
// True when `p` has exactly one conversion of the form %[0][width]d and no other '%'.
bool valid_pattern(const std::string& p) {
  int conversions = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] != '%') continue;
    size_t j = i + 1;
    while (j < p.size() && std::isdigit(static_cast<unsigned char>(p[j]))) ++j;
    if (j >= p.size() || p[j] != 'd' || j - i - 1 > 2) return false;
    ++conversions;
    i = j;
  }
  return conversions == 1;
}
}  // namespace

PngSequenceWriter::PngSequenceWriter(const std::string& dir, const std::string& pattern, int first_index)
    : dir_(dir), pattern_(pattern), next_(first_index) {
  if (!valid_pattern(pattern)) {
    throw wm::Error("PngSequenceWriter(" + dir + "): pattern '" + pattern +
                    "' must hold exactly one integer conversion such as %05d and no other '%'");
  }
  if (pattern.find('/') != std::string::npos) {
    throw wm::Error("PngSequenceWriter(" + dir + "): pattern '" + pattern + "' must be a file name, not a path");
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    throw wm::Error("PngSequenceWriter(" + dir + "): cannot create the directory" +
                    (ec ? ": " + ec.message() : std::string(" (a file of that name exists)")));
  }
}

std::string PngSequenceWriter::path_for(int index) const {
  char name[512];
  std::snprintf(name, sizeof(name), pattern_.c_str(), index);
  return (fs::path(dir_) / name).string();
}

std::string PngSequenceWriter::write(const wm::Image& frame) {
  std::string p = path_for(next_);
  write_png(p, frame);
  ++next_;
  ++written_;
  return p;
}

}  // namespace wm::media
