#pragma once
// Small shared helpers for the FFmpeg-based writer and reader: RAII owners and error text.
// Internal to wm_media; include only from .cpp files.
extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/error.h>
#include <libavutil/frame.h>
#include <libavutil/pixdesc.h>
#include <libswscale/swscale.h>
}

#include <memory>
#include <stdexcept>
#include <string>

#include "runtime/error.h"

namespace wm::media::detail {

// FFmpeg's message for an AVERROR code (av_strerror into a buffer; av_err2str is C-only).
inline std::string av_error_string(int err) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {0};
  if (av_strerror(err, buf, sizeof(buf)) < 0) return "unknown FFmpeg error " + std::to_string(err);
  return buf;
}

// Throws wm::Error "<what>: <ffmpeg message>" when err < 0; returns err otherwise.
inline int av_check(int err, const std::string& what) {
  if (err < 0) throw wm::Error(what + ": " + av_error_string(err));
  return err;
}

struct CodecContextDeleter {
  void operator()(AVCodecContext* c) const { avcodec_free_context(&c); }
};
struct FrameDeleter {
  void operator()(AVFrame* f) const { av_frame_free(&f); }
};
struct PacketDeleter {
  void operator()(AVPacket* p) const { av_packet_free(&p); }
};
struct SwsDeleter {
  void operator()(SwsContext* s) const { sws_freeContext(s); }
};
// An output context owns its AVIOContext when the muxer needs a file.
struct OutputFormatDeleter {
  void operator()(AVFormatContext* f) const {
    if (f->oformat && !(f->oformat->flags & AVFMT_NOFILE) && f->pb) avio_closep(&f->pb);
    avformat_free_context(f);
  }
};
struct InputFormatDeleter {
  void operator()(AVFormatContext* f) const { avformat_close_input(&f); }
};

// Lowers FFmpeg's global log level from its default (info) to warnings, once, so that encoders
// such as libx264 do not print their banners and statistics; a level the program chose is kept.
inline void quiet_default_ffmpeg_log() {
  static const bool done = [] {
    if (av_log_get_level() == AV_LOG_INFO) av_log_set_level(AV_LOG_WARNING);
    return true;
  }();
  (void)done;
}

using CodecContextPtr = std::unique_ptr<AVCodecContext, CodecContextDeleter>;
using FramePtr = std::unique_ptr<AVFrame, FrameDeleter>;
using PacketPtr = std::unique_ptr<AVPacket, PacketDeleter>;
using SwsPtr = std::unique_ptr<SwsContext, SwsDeleter>;
using OutputFormatPtr = std::unique_ptr<AVFormatContext, OutputFormatDeleter>;
using InputFormatPtr = std::unique_ptr<AVFormatContext, InputFormatDeleter>;

}  // namespace wm::media::detail
