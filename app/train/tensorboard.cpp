// TensorBoard event files: TFRecord framing with masked CRC-32C (Boost.CRC), Event protobufs
// (tensorboard_event.proto), trimming on resume, and dptrain's scalars, images and text.
#include "train/tensorboard.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <boost/crc.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dp/error.hpp"
#include "dp/fs.hpp"
#include "dp/image_io.hpp"
#include "train/tensorboard_event.pb.h"

namespace dp::app {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFileVersion = "brain.Event:2";
constexpr size_t kHeaderBytes = 8 + 4, kFooterBytes = 4;

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out += char((v >> (8 * i)) & 0xff);
}

uint64_t get_le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(uint8_t(p[i])) << (8 * i);
  return v;
}

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  DP_CHECK(f.good(), "cannot open '", path, "': ", std::strerror(errno));
  std::ostringstream s;
  s << f.rdbuf();
  DP_CHECK(!f.bad(), "reading '", path, "' failed");
  return s.str();
}

// Writes all of `data` at the end of `fd`; on failure truncates the file back to `size` and
// returns errno (0: written).
int append_whole(int fd, const std::string& data) {
  const off_t size = ::lseek(fd, 0, SEEK_END);
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      if (size >= 0) (void)!::ftruncate(fd, size);
      return err;
    }
    done += size_t(n);
  }
  return 0;
}

std::string event_record(const tb::Event& event) {
  std::string data;
  DP_CHECK(event.SerializeToString(&data), "cannot serialise a TensorBoard event");
  return frame_record(data);
}

// Whether a record is kept when a run resumes after step `resume_step`: the file's version
// record, and every event of an earlier step except the configuration written at that step.
bool keep_on_resume(const std::string& record, int64_t resume_step, bool& is_version) {
  tb::Event e;
  if (!e.ParseFromString(record)) return false;
  is_version = e.what_case() == tb::Event::kFileVersion;
  if (is_version) return true;
  if (e.step() > resume_step) return false;
  if (e.step() == resume_step && e.has_summary())
    for (const auto& v : e.summary().value())
      if (v.tag() == EventFile::kConfigTag) return false;
  return true;
}

tb::Event version_event() {
  tb::Event e;
  e.set_wall_time(unix_seconds());
  e.set_file_version(kFileVersion);
  return e;
}

std::string host_name() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) return "localhost";
  return host;
}

}  // namespace

uint32_t masked_crc32c(const void* data, size_t size) {
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data, size);
  const uint32_t c = crc.checksum();
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string frame_record(const std::string& data) {
  std::string out;
  out.reserve(kHeaderBytes + data.size() + kFooterBytes);
  put_le(out, data.size(), 8);
  put_le(out, masked_crc32c(out.data(), 8), 4);
  out += data;
  put_le(out, masked_crc32c(data.data(), data.size()), 4);
  return out;
}

RecordScan scan_records(const std::string& bytes) {
  RecordScan s;
  size_t at = 0;
  while (at < bytes.size()) {
    if (bytes.size() - at < kHeaderBytes) {
      s.stop = str_cat("a record header cut short at byte ", at);
      break;
    }
    const uint64_t length = get_le(bytes.data() + at, 8);
    if (get_le(bytes.data() + at + 8, 4) != masked_crc32c(bytes.data() + at, 8)) {
      s.stop = str_cat("a corrupt record length at byte ", at);
      break;
    }
    if (length > bytes.size() - at - kHeaderBytes ||
        bytes.size() - at - kHeaderBytes - length < kFooterBytes) {
      s.stop = str_cat("a record cut short at byte ", at);
      break;
    }
    const char* data = bytes.data() + at + kHeaderBytes;
    if (get_le(data + length, 4) != masked_crc32c(data, length)) {
      s.stop = str_cat("a corrupt record at byte ", at);
      break;
    }
    s.records.emplace_back(data, length);
    at += kHeaderBytes + length + kFooterBytes;
  }
  s.whole_bytes = at;
  return s;
}

EventFile::EventFile(const std::string& dir, int64_t resume_step, Logger log) : log_(log) {
  ensure_writable_dir(dir);
  std::vector<std::string> existing;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.is_regular_file() && entry.path().filename().string().rfind(kPrefix, 0) == 0)
      existing.push_back(entry.path().string());
  std::sort(existing.begin(), existing.end());
  // Trim every event file of the directory to the resumed state (TensorBoard reads them all);
  // append to the newest.
  for (const std::string& file : existing) {
    const std::string bytes = read_file(file);
    const RecordScan scan = scan_records(bytes);
    std::string kept;
    size_t dropped = 0;
    bool has_version = false;
    for (const std::string& r : scan.records) {
      bool is_version = false;
      if (keep_on_resume(r, resume_step, is_version) && !(is_version && has_version)) {
        kept += frame_record(r);
        has_version = has_version || is_version;
      } else {
        ++dropped;
      }
    }
    if (!has_version) kept.insert(0, event_record(version_event()));  // TensorBoard needs it
    if (dropped > 0 || !has_version || !scan.stop.empty()) {
      if (!scan.stop.empty())
        log_.warn("--tensorboard: '", file, "' ends in ", scan.stop, " (",
                  bytes.size() - scan.whole_bytes, " byte(s) dropped; a job killed while writing)");
      const std::string tmp = temp_path_for(file);
      {
        std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
        f << kept;
        f.flush();
        if (!f.good()) {
          std::remove(tmp.c_str());
          fail("cannot write '", tmp, "'");
        }
      }
      commit_file(tmp, file);
    }
  }
  const bool fresh = existing.empty();
  path_ =
      fresh ? (fs::path(dir) / str_cat(kPrefix, int64_t(unix_seconds()), ".", host_name())).string()
            : existing.back();
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  DP_CHECK(fd_ >= 0, "cannot open '", path_, "' for appending: ", std::strerror(errno));
  if (fresh) append(version_event());
}

EventFile::~EventFile() {
  if (fd_ >= 0) ::close(fd_);
}

void EventFile::append(const tb::Event& event) {
  if (failed_) return;
  if (const int err = append_whole(fd_, event_record(event)); err != 0) {
    failed_ = true;
    log_.warn("--tensorboard: writing '", path_, "' failed (", std::strerror(err),
              "); no more TensorBoard events in this run (training goes on)");
  }
}

TensorBoardLog::TensorBoardLog(const std::string& model_dir, int64_t resume_step, int log_every,
                               Logger log)
    : file_((fs::path(model_dir) / kDirName).string(), resume_step, log),
      every_(std::max(1, log_every)) {}

void TensorBoardLog::config(int64_t step, const std::string& text) {
  tb::Event e;
  e.set_wall_time(unix_seconds());
  e.set_step(step);
  tb::Summary::Value* v = e.mutable_summary()->add_value();
  v->set_tag(EventFile::kConfigTag);
  v->mutable_metadata()->mutable_plugin_data()->set_plugin_name("text");
  v->mutable_metadata()->set_data_class(tb::DATA_CLASS_TENSOR);
  tb::TensorProto* t = v->mutable_tensor();
  t->set_dtype(tb::DT_STRING);
  t->mutable_tensor_shape();  // no dimensions: a scalar string
  // Markdown: four spaces make each line preformatted.
  std::string markdown;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) markdown += "    " + line + "\n";
  t->add_string_val(markdown);
  file_.append(e);
}

void TensorBoardLog::start_window() {
  loss_ = pixels_ = 0;
  images_ = 0;
  window_start_ = Clock::now();
}

void TensorBoardLog::step(int64_t step, double loss_sum, double pixels, int64_t images, double lr) {
  loss_ += loss_sum;
  pixels_ += pixels;
  images_ += images;
  if (step % every_ != 0) return;
  const double seconds = std::chrono::duration<double>(Clock::now() - window_start_).count();
  std::vector<std::pair<std::string, double>> values{{"train/lr", lr}};
  if (pixels_ > 0) values.emplace_back("train/loss", loss_ / pixels_);  // none: skipped steps
  if (seconds > 0) values.emplace_back("train/images_per_s", double(images_) / seconds);
  scalars(step, values);
  start_window();
}

void TensorBoardLog::scalars(int64_t step,
                             const std::vector<std::pair<std::string, double>>& values) {
  tb::Event e;
  e.set_wall_time(unix_seconds());
  e.set_step(step);
  for (const auto& [tag, value] : values) {
    tb::Summary::Value* v = e.mutable_summary()->add_value();
    v->set_tag(tag);
    v->set_simple_value(float(value));
  }
  file_.append(e);
}

void TensorBoardLog::image(int64_t step, const std::string& tag, const uint8_t* pixels, int width,
                           int height, int channels) {
  const std::vector<uint8_t> png = data::encode_png(pixels, width, height, channels);
  tb::Event e;
  e.set_wall_time(unix_seconds());
  e.set_step(step);
  tb::Summary::Value* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  tb::Summary::Image* img = v->mutable_image();
  img->set_height(height);
  img->set_width(width);
  img->set_colorspace(channels);
  img->set_encoded_image_string(png.data(), png.size());
  file_.append(e);
}

}  // namespace dp::app
