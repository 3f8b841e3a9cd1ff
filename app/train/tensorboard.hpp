// TensorBoard event files (dptrain --tensorboard): the record format, and the scalars, images and
// text that rank 0 writes under <model-dir>/tb/ for `tensorboard --logdir`.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dp/log.hpp"

namespace dp::tb {
class Event;
}

namespace dp::app {

// TFRecord framing as TensorBoard reads it: little-endian uint64 length, masked CRC-32C of the
// length, the data, masked CRC-32C of the data. CRC-32C is Castagnoli's (Boost.CRC); the mask
// rotates it right by 15 bits and adds 0xa282ead8.
uint32_t masked_crc32c(const void* data, size_t size);
std::string frame_record(const std::string& data);

// The whole records at the start of `bytes`; scanning stops at the first incomplete or corrupt
// one (a job killed while appending), which `stop` describes (empty: all of `bytes` was read).
struct RecordScan {
  std::vector<std::string> records;
  size_t whole_bytes = 0;  // bytes of the whole records
  std::string stop;
};
RecordScan scan_records(const std::string& bytes);

// An event file, appended one whole record per write(2): a killed job leaves every record it
// finished readable. A write that fails (a full disk) is undone (the file is truncated back),
// logged once as a warning, and ends the writing: TensorBoard output never stops training.
class EventFile {
 public:
  static constexpr const char* kPrefix = "events.out.tfevents.";
  static constexpr const char* kConfigTag = "config";  // the text written at every start

  // Opens the event file of `dir` (created with the directory if there is none) for a run that
  // continues after optimiser step `resume_step` (0: fresh). Records of later steps, and the
  // configuration text at `resume_step`, are what the resumed run writes again: they are dropped
  // from the existing file(s), rewritten atomically, as is a torn last record. Throws dp::Error
  // naming the file when it cannot be read or created.
  EventFile(const std::string& dir, int64_t resume_step, Logger log);
  ~EventFile();
  EventFile(const EventFile&) = delete;
  EventFile& operator=(const EventFile&) = delete;

  void append(const tb::Event& event);
  const std::string& path() const { return path_; }
  bool failed() const { return failed_; }

 private:
  std::string path_;
  Logger log_;
  int fd_ = -1;
  bool failed_ = false;
};

// What dptrain shows in TensorBoard, by tag; every point's step is the optimiser step of the run
// (so per-step and per-epoch curves share an x axis, and a resumed run continues them):
//   train/loss, train/lr, train/images_per_s   every --log-every steps (0: every step); the loss
//                                              is rank 0's mean per pixel since the last point
//   epoch/train_loss, epoch/lr, epoch/seconds, epoch/images_per_s, epoch/allreduce_wait_ms
//   valid/loss, valid/iou, valid/dice, valid/precision, valid/recall   validated epochs
//   samples/<index>   image | ground truth | prediction, per validated epoch
//   config            the effective options (text), at every start
class TensorBoardLog {
 public:
  static constexpr const char* kDirName = "tb";

  TensorBoardLog(const std::string& model_dir, int64_t resume_step, int log_every, Logger log);

  // The effective options, as a preformatted text block.
  void config(int64_t step, const std::string& text);
  // A new window of per-step points (at an epoch's start: the pause before it is not counted).
  void start_window();
  // After optimiser step `step`: rank 0's summed loss and pixels in it, the global images.
  void step(int64_t step, double loss_sum, double pixels, int64_t images, double lr);
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  // An 8-bit image with 1 or 3 channels, stored as PNG.
  void image(int64_t step, const std::string& tag, const uint8_t* pixels, int width, int height,
             int channels);
  const std::string& path() const { return file_.path(); }

 private:
  using Clock = std::chrono::steady_clock;
  EventFile file_;
  int every_;
  double loss_ = 0, pixels_ = 0;
  int64_t images_ = 0;
  Clock::time_point window_start_ = Clock::now();
};

}  // namespace dp::app
