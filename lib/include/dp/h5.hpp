// RAII wrappers over the HDF5 C API (files, groups, datasets, attributes) with DP_H5_CHECK errors.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace dp::h5 {

// The serial HDF5 library is not thread-safe: every HDF5 call in dptrain runs under this lock.
std::recursive_mutex& mutex();

// Throws dp::Error "<what>: <HDF5's own message from the error stack> (at file:line)" if status <
// 0.
void check(int64_t status, const char* what, const char* file, int line);
#define DP_H5_CHECK(call) ::dp::h5::check(static_cast<int64_t>(call), #call, __FILE__, __LINE__)

// What a file may claim, checked before anything is allocated from it: an attribute's data (also
// at most the size of a file opened for reading) and a dataset's element count.
inline constexpr int64_t kMaxAttrBytes = int64_t{64} << 20;
inline constexpr int64_t kMaxElements = int64_t{1} << 50;
// Deflate's largest compression ratio (a 258-byte match in 2 bits): filtered data takes at least
// this fraction of its size.
inline constexpr int64_t kMaxDeflateRatio = 1032;

// Owns one hid_t and closes it with the right H5*close on destruction. Move-only.
class Id {
 public:
  Id() = default;
  explicit Id(hid_t id);
  ~Id();
  Id(Id&& o) noexcept;
  Id& operator=(Id&& o) noexcept;
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }

 private:
  hid_t id_ = -1;
};

enum class Mode { kRead, kTruncate };

class File;

// A location (file or group) that holds attributes, groups and datasets.
class Location {
 public:
  hid_t id() const { return id_.get(); }
  bool exists(const std::string& path) const;  // "a/b/c" relative; false if any part is missing
  // Attributes (scalar). Readers throw dp::Error naming the attribute and object if absent.
  void set_attr(const std::string& name, const std::string& value);
  void set_attr(const std::string& name, int64_t value);
  void set_attr(const std::string& name, double value);
  void set_attr(const std::string& name, const std::vector<double>& values);  // 1-D array
  bool has_attr(const std::string& name) const;
  std::string attr_string(const std::string& name) const;
  int64_t attr_int(const std::string& name) const;
  double attr_double(const std::string& name) const;
  std::vector<double> attr_doubles(const std::string& name) const;
  // The attributes' names, sorted, and what one holds.
  enum class AttrKind { kInteger, kNumber, kString, kOther };
  std::vector<std::string> attr_names() const;
  AttrKind attr_kind(const std::string& name) const;
  // Creates a group (and missing parents) or opens an existing one.
  class Group group(const std::string& path);
  class Group open_group(const std::string& path) const;
  // Names of the direct children (groups and datasets), sorted.
  std::vector<std::string> children() const;
  const std::string& name() const { return name_; }  // file path or "file:/group", for messages

 protected:
  Location() = default;
  Location(Id id, std::string name) : id_(std::move(id)), name_(std::move(name)) {}
  Id id_;
  std::string name_;
};

class Group : public Location {
 public:
  Group(Id id, std::string name) : Location(std::move(id), std::move(name)) {}
};

class File : public Location {
 public:
  // kRead opens read-only; kTruncate creates (or truncates). Errors name the path.
  File(const std::string& path, Mode mode);
  void flush();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Element types stored by dptrain.
enum class Type { kUint8, kFloat32 };

class Dataset {
 public:
  // Creates `path` (parents created) under `loc`. `chunk` empty = contiguous; gzip 0 = none.
  static Dataset create(Location& loc, const std::string& path, Type type,
                        const std::vector<int64_t>& shape, const std::vector<int64_t>& chunk = {},
                        int gzip_level = 0);
  static Dataset open(const Location& loc, const std::string& path);
  const std::vector<int64_t>& shape() const { return shape_; }
  Type type() const { return type_; }
  int64_t numel() const;
  // Whole-dataset I/O; `data` has numel() elements of the dataset's type (checked).
  void write(const float* data);
  void write(const uint8_t* data);
  void read(float* data) const;
  void read(uint8_t* data) const;
  // I/O of rows [first, first+count) along dimension 0 (one sample = one row). One uint8 row of a
  // dataset whose chunks are single rows compressed by deflate alone is read raw under the lock
  // and inflated after it, so threads reading rows decompress in parallel.
  void write_rows(int64_t first, int64_t count, const uint8_t* data);
  void read_rows(int64_t first, int64_t count, uint8_t* data) const;
  void read_rows(int64_t first, int64_t count, float* data) const;
  Location& attrs();  // the dataset as an attribute holder
  // Throws unless the file holds this dataset's data: the bytes it stores (allocated chunks, or
  // the contiguous block) fit in the file and are at least what every element needs (all of it
  // unfiltered, 1/kMaxDeflateRatio of it through deflate, shuffle and fletcher32). So a small
  // file cannot claim a huge dataset, and a dataset with missing rows is refused.
  void check_stored() const;
  const std::string& name() const { return attrs_.name(); }

 private:
  class Attrs : public Location {
   public:
    Attrs() = default;
    Attrs(Id id, std::string name) : Location(std::move(id), std::move(name)) {}
  };
  Dataset(Id id, std::string name);
  void read_rows_as(Type type, int64_t first, int64_t count, void* data) const;
  void read_deflated_row(int64_t row, uint8_t* data) const;
  Attrs attrs_;
  std::vector<int64_t> shape_;
  Type type_ = Type::kFloat32;
  size_t deflated_row_bytes_ = 0;  // > 0: one-row chunks, deflate alone, uint8; bytes of a row
};

}  // namespace dp::h5
