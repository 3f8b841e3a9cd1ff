// RAII HDF5 wrappers: every call under dp::h5::mutex(), failures as one-line dp::Error.
#include "dp/h5.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <numeric>
#include <utility>

#include <zlib.h>

#include "dp/error.hpp"

namespace dp::h5 {

namespace {

// Every HDF5 call runs inside a Guard: it holds the global lock and makes sure HDF5's automatic
// error printing is off (per thread, which is once for the serial library: its error stack is
// global).
class Guard {
 public:
  Guard() : lock_(mutex()) {
    // No clean-up of HDF5 at exit: after a failed write (a full disk) HDF5 1.10's clean-up of the
    // file it could not close crashes (SIGSEGV in H5F__close_cb) after the error was reported.
    // Every file is closed by its owner (Id) before that, so nothing is lost.
    static const bool no_atexit = (H5dont_atexit(), true);
    (void)no_atexit;
    thread_local bool silenced = false;
    if (!silenced) {
      H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
      silenced = true;
    }
  }

 private:
  std::lock_guard<std::recursive_mutex> lock_;
};

// Only the file name of a source path, for shorter messages.
const char* base_name(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

struct StackInfo {
  std::string desc;    // description of the innermost entry that has one
  hid_t min_num = -1;  // minor error number of the innermost entry
};

// H5Ewalk2 callback, walking upward: entry 0 is the innermost (where HDF5 detected the error).
herr_t collect_error(unsigned n, const H5E_error2_t* err, void* data) {
  auto* info = static_cast<StackInfo*>(data);
  if (n == 0) info->min_num = err->min_num;
  if (info->desc.empty() && err->desc && err->desc[0] != '\0') info->desc = err->desc;
  return 0;
}

// HDF5's own message for the error now on the default stack (caller holds the lock).
std::string hdf5_message() {
  StackInfo info;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, collect_error, &info);
  if (info.desc.empty() && info.min_num >= 0) {
    constexpr size_t kMsgCapacity = 256;
    char buf[kMsgCapacity] = {};
    if (H5Eget_msg(info.min_num, nullptr, buf, sizeof buf) > 0) info.desc = buf;
  }
  H5Eclear2(H5E_DEFAULT);
  return info.desc.empty() ? std::string("failed (HDF5 gave no message)") : info.desc;
}

// check() with a composed message instead of the call text alone.
void check_msg(int64_t status, const std::string& what, const char* file, int line) {
  if (status >= 0) return;
  Guard guard;
  fail(what, ": ", hdf5_message(), " (at ", base_name(file), ":", line, ")");
}

// Like DP_H5_CHECK, with a message naming what was being done (built only on failure).
#define DP_H5_CHECK_MSG(call, ...) DP_H5_CHECK_TEXT(call, #call, __VA_ARGS__)
#define DP_H5_CHECK_TEXT(call, text, ...)                                                         \
  do {                                                                                            \
    const auto dp_h5_status_ = (call);                                                            \
    if (dp_h5_status_ < 0) {                                                                      \
      check_msg(static_cast<int64_t>(dp_h5_status_), ::dp::str_cat(__VA_ARGS__, " [", text, "]"), \
                __FILE__, __LINE__);                                                              \
    }                                                                                             \
  } while (0)

// Checked creation of an owned id.
#define DP_H5_ID(call, ...)                          \
  [&] {                                              \
    const hid_t dp_h5_id_ = (call);                  \
    DP_H5_CHECK_TEXT(dp_h5_id_, #call, __VA_ARGS__); \
    return Id(dp_h5_id_);                            \
  }()

// "uint8", "float32", "string", ... for messages.
std::string type_name(hid_t type) {
  const H5T_class_t cls = H5Tget_class(type);
  const size_t bits = H5Tget_size(type) * 8;
  switch (cls) {
    case H5T_INTEGER:
      return str_cat(H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int", bits);
    case H5T_FLOAT:
      return str_cat("float", bits);
    case H5T_STRING:
      return "string";
    case H5T_COMPOUND:
      return "compound";
    case H5T_ENUM:
      return "enum";
    case H5T_ARRAY:
      return "array";
    case H5T_VLEN:
      return "vlen";
    case H5T_OPAQUE:
      return "opaque";
    case H5T_REFERENCE:
      return "reference";
    case H5T_BITFIELD:
      return "bitfield";
    default:
      return "unknown type";
  }
}

const char* type_name(Type t) {
  return t == Type::kUint8 ? "uint8" : "float32";
}

// Path of `id` inside its file ("/" for the file itself).
std::string object_path(hid_t id) {
  const ssize_t len = H5Iget_name(id, nullptr, 0);
  if (len <= 0) return "/";
  std::string s(static_cast<size_t>(len) + 1, '\0');
  H5Iget_name(id, s.data(), s.size());
  s.resize(static_cast<size_t>(len));
  return s;
}

std::string file_name(hid_t id) {
  const ssize_t len = H5Fget_name(id, nullptr, 0);
  if (len <= 0) return "?";
  std::string s(static_cast<size_t>(len) + 1, '\0');
  H5Fget_name(id, s.data(), s.size());
  s.resize(static_cast<size_t>(len));
  return s;
}

// Message name of `rel` (relative or absolute) below the object `id`: "file.h5:/a/b".
std::string child_name(hid_t id, const std::string& rel) {
  std::string path;
  if (!rel.empty() && rel.front() == '/') {
    path = rel;
  } else {
    path = object_path(id);
    if (path.empty() || path.back() != '/') path += '/';
    path += rel;
  }
  return str_cat(file_name(id), ":", path);
}

// Components of a slash-separated path (empty components dropped).
std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    if (end > start) parts.push_back(path.substr(start, end - start));
    start = end + 1;
  }
  return parts;
}

bool path_exists(hid_t loc, const std::string& path) {
  std::string prefix = (!path.empty() && path.front() == '/') ? "/" : "";
  for (const std::string& part : split_path(path)) {
    if (!prefix.empty() && prefix.back() != '/') prefix += '/';
    prefix += part;
    if (H5Lexists(loc, prefix.c_str(), H5P_DEFAULT) <= 0) {
      H5Eclear2(H5E_DEFAULT);
      return false;
    }
  }
  return true;
}

// Kind of the object at `path`, or H5I_BADID if it cannot be opened.
H5I_type_t object_kind(hid_t loc, const std::string& path) {
  const hid_t obj = H5Oopen(loc, path.c_str(), H5P_DEFAULT);
  if (obj < 0) {
    H5Eclear2(H5E_DEFAULT);
    return H5I_BADID;
  }
  const H5I_type_t kind = H5Iget_type(obj);
  H5Oclose(obj);
  return kind;
}

const char* kind_name(H5I_type_t kind) {
  switch (kind) {
    case H5I_GROUP:
      return "a group";
    case H5I_DATASET:
      return "a dataset";
    case H5I_DATATYPE:
      return "a named datatype";
    default:
      return "not an object";
  }
}

// A link creation property list that creates missing parent groups.
Id intermediate_lcpl() {
  Id lcpl = DP_H5_ID(H5Pcreate(H5P_LINK_CREATE), "creating a link property list");
  DP_H5_CHECK_MSG(H5Pset_create_intermediate_group(lcpl.get(), 1), "setting intermediate groups");
  return lcpl;
}

Id scalar_space() {
  return DP_H5_ID(H5Screate(H5S_SCALAR), "creating a scalar dataspace");
}

// Number of elements of a dataspace.
int64_t space_points(hid_t space, const std::string& what) {
  const hssize_t n = H5Sget_simple_extent_npoints(space);
  DP_H5_CHECK_MSG(n, "reading the extent of ", what);
  return static_cast<int64_t>(n);
}

// Size in bytes of the file holding `obj` if it is open read-only, else -1 (a file being written
// has data not yet placed).
int64_t readonly_file_bytes(hid_t obj) {
  const hid_t file = H5Iget_file_id(obj);
  if (file < 0) {
    H5Eclear2(H5E_DEFAULT);
    return -1;
  }
  unsigned intent = 0;
  hsize_t size = 0;
  const bool known = H5Fget_intent(file, &intent) >= 0 && H5Fget_filesize(file, &size) >= 0;
  H5Fclose(file);
  H5Eclear2(H5E_DEFAULT);
  return known && intent == H5F_ACC_RDONLY ? static_cast<int64_t>(size) : -1;
}

// Throws unless `count` elements of `element_bytes` each fit in kMaxAttrBytes and, read-only, in
// the file: checked before the attribute's value is allocated.
void check_attr_size(const Location& loc, const std::string& name, int64_t count,
                     size_t element_bytes) {
  const int64_t file_bytes = readonly_file_bytes(loc.id());
  const int64_t limit = file_bytes >= 0 ? std::min(kMaxAttrBytes, file_bytes) : kMaxAttrBytes;
  const auto size = static_cast<int64_t>(std::max<size_t>(element_bytes, 1));
  DP_CHECK(
      count >= 0 && element_bytes <= static_cast<size_t>(kMaxAttrBytes) && count <= limit / size,
      "attribute '", name, "' of '", loc.name(), "' claims ", count, " elements of ", element_bytes,
      " bytes, more than ",
      file_bytes >= 0 && file_bytes < kMaxAttrBytes ? "the file holds (" : "the limit (", limit,
      " bytes)");
}

}  // namespace

std::recursive_mutex& mutex() {
  static std::recursive_mutex m;
  return m;
}

void check(int64_t status, const char* what, const char* file, int line) {
  if (status < 0) check_msg(status, what, file, line);
}

// ---------------------------------------------------------------------------------------------
// Id

Id::Id(hid_t id) : id_(id) {}

Id::~Id() {
  if (id_ < 0) return;
  Guard guard;
  switch (H5Iget_type(id_)) {
    case H5I_FILE:
      H5Fclose(id_);
      break;
    case H5I_GROUP:
      H5Gclose(id_);
      break;
    case H5I_DATASET:
      H5Dclose(id_);
      break;
    case H5I_ATTR:
      H5Aclose(id_);
      break;
    case H5I_DATASPACE:
      H5Sclose(id_);
      break;
    case H5I_DATATYPE:
      H5Tclose(id_);
      break;
    case H5I_GENPROP_LST:
      H5Pclose(id_);
      break;
    default:
      break;  // already closed or not an id we own
  }
  H5Eclear2(H5E_DEFAULT);
}

Id::Id(Id&& o) noexcept : id_(std::exchange(o.id_, -1)) {}

Id& Id::operator=(Id&& o) noexcept {
  if (this != &o) {
    Id old(std::exchange(id_, std::exchange(o.id_, -1)));  // closes the previous id
  }
  return *this;
}

// ---------------------------------------------------------------------------------------------
// Location: attributes, groups, children

namespace {

// Opens attribute `name` of `loc`, or throws naming it and the object.
Id open_attr(const Location& loc, const std::string& name) {
  const htri_t exists = H5Aexists(loc.id(), name.c_str());
  DP_H5_CHECK_MSG(exists, "looking up attribute '", name, "' of '", loc.name(), "'");
  DP_CHECK(exists > 0, "attribute '", name, "' not found on '", loc.name(), "'");
  return DP_H5_ID(H5Aopen(loc.id(), name.c_str(), H5P_DEFAULT), "opening attribute '", name,
                  "' of '", loc.name(), "'");
}

// Replaces attribute `name` of `loc` with one of the given file type and space, and writes it.
void write_attr(Location& loc, const std::string& name, hid_t file_type, hid_t mem_type,
                hid_t space, const void* data) {
  const htri_t exists = H5Aexists(loc.id(), name.c_str());
  DP_H5_CHECK_MSG(exists, "looking up attribute '", name, "' of '", loc.name(), "'");
  if (exists > 0) {
    DP_H5_CHECK_MSG(H5Adelete(loc.id(), name.c_str()), "replacing attribute '", name, "' of '",
                    loc.name(), "'");
  }
  Id attr = DP_H5_ID(H5Acreate2(loc.id(), name.c_str(), file_type, space, H5P_DEFAULT, H5P_DEFAULT),
                     "creating attribute '", name, "' of '", loc.name(), "'");
  if (data == nullptr) return;  // an empty (null dataspace) attribute has no data
  DP_H5_CHECK_MSG(H5Awrite(attr.get(), mem_type, data), "writing attribute '", name, "' of '",
                  loc.name(), "'");
}

// Reads a numeric attribute as `count` values of `mem_type`; checks class and element count.
template <typename T>
std::vector<T> read_numeric_attr(const Location& loc, const std::string& name, hid_t mem_type,
                                 bool allow_float, const char* expected, bool single) {
  Id attr = open_attr(loc, name);
  Id type = DP_H5_ID(H5Aget_type(attr.get()), "reading the type of attribute '", name, "'");
  const H5T_class_t cls = H5Tget_class(type.get());
  DP_CHECK(cls == H5T_INTEGER || (allow_float && cls == H5T_FLOAT), "attribute '", name, "' of '",
           loc.name(), "' has type ", type_name(type.get()), ", expected ", expected);
  Id space = DP_H5_ID(H5Aget_space(attr.get()), "reading the dataspace of attribute '", name, "'");
  const int64_t n = space_points(space.get(), str_cat("attribute '", name, "'"));
  check_attr_size(loc, name, n, H5Tget_size(type.get()));
  if (single) {
    DP_CHECK(n == 1, "attribute '", name, "' of '", loc.name(), "' has ", n,
             " elements, expected a scalar");
  }
  std::vector<T> values(static_cast<size_t>(n));
  if (n > 0) {
    DP_H5_CHECK_MSG(H5Aread(attr.get(), mem_type, values.data()), "reading attribute '", name,
                    "' of '", loc.name(), "'");
  }
  return values;
}

}  // namespace

bool Location::exists(const std::string& path) const {
  Guard guard;
  return path_exists(id(), path);
}

void Location::set_attr(const std::string& name, const std::string& value) {
  Guard guard;
  Id type = DP_H5_ID(H5Tcopy(H5T_C_S1), "copying the string type");
  // Fixed-length, null-terminated UTF-8; HDF5 does not allow a size of 0.
  DP_H5_CHECK_MSG(H5Tset_size(type.get(), value.size() + 1), "sizing string attribute '", name,
                  "'");
  DP_H5_CHECK_MSG(H5Tset_strpad(type.get(), H5T_STR_NULLTERM), "setting string padding");
  DP_H5_CHECK_MSG(H5Tset_cset(type.get(), H5T_CSET_UTF8), "setting the UTF-8 character set");
  Id space = scalar_space();
  write_attr(*this, name, type.get(), type.get(), space.get(), value.c_str());
}

void Location::set_attr(const std::string& name, int64_t value) {
  Guard guard;
  Id space = scalar_space();
  write_attr(*this, name, H5T_STD_I64LE, H5T_NATIVE_INT64, space.get(), &value);
}

void Location::set_attr(const std::string& name, double value) {
  Guard guard;
  Id space = scalar_space();
  write_attr(*this, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, space.get(), &value);
}

void Location::set_attr(const std::string& name, const std::vector<double>& values) {
  Guard guard;
  const hsize_t dims[1] = {values.size()};
  Id space = values.empty()
                 ? DP_H5_ID(H5Screate(H5S_NULL), "creating an empty dataspace")
                 : DP_H5_ID(H5Screate_simple(1, dims, nullptr), "creating a 1-D dataspace");
  write_attr(*this, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, space.get(),
             values.empty() ? nullptr : values.data());
}

bool Location::has_attr(const std::string& name) const {
  Guard guard;
  const htri_t exists = H5Aexists(id(), name.c_str());
  DP_H5_CHECK_MSG(exists, "looking up attribute '", name, "' of '", name_, "'");
  return exists > 0;
}

std::string Location::attr_string(const std::string& name) const {
  Guard guard;
  Id attr = open_attr(*this, name);
  Id type = DP_H5_ID(H5Aget_type(attr.get()), "reading the type of attribute '", name, "'");
  DP_CHECK(H5Tget_class(type.get()) == H5T_STRING, "attribute '", name, "' of '", name_,
           "' has type ", type_name(type.get()), ", expected a string");
  Id space = DP_H5_ID(H5Aget_space(attr.get()), "reading the dataspace of attribute '", name, "'");
  const int64_t n = space_points(space.get(), str_cat("attribute '", name, "'"));
  DP_CHECK(n == 1, "attribute '", name, "' of '", name_, "' has ", n,
           " strings, expected a scalar string");
  const htri_t is_variable = H5Tis_variable_str(type.get());
  DP_H5_CHECK_MSG(is_variable, "inspecting string attribute '", name, "'");
  if (is_variable > 0) {
    Id mem = DP_H5_ID(H5Tcopy(H5T_C_S1), "copying the string type");
    DP_H5_CHECK_MSG(H5Tset_size(mem.get(), H5T_VARIABLE), "making a variable-length string type");
    DP_H5_CHECK_MSG(H5Tset_cset(mem.get(), H5Tget_cset(type.get())), "setting the character set");
    char* raw = nullptr;
    DP_H5_CHECK_MSG(H5Aread(attr.get(), mem.get(), &raw), "reading attribute '", name, "' of '",
                    name_, "'");
    std::string value = raw ? std::string(raw) : std::string();
    if (raw) H5free_memory(raw);
    return value;
  }
  const size_t size = H5Tget_size(type.get());
  check_attr_size(*this, name, 1, size);
  std::string buf(size, '\0');
  DP_H5_CHECK_MSG(H5Aread(attr.get(), type.get(), buf.data()), "reading attribute '", name,
                  "' of '", name_, "'");
  if (H5Tget_strpad(type.get()) == H5T_STR_SPACEPAD) {
    buf.erase(buf.find_last_not_of(' ') + 1);
  } else {
    buf.resize(std::strlen(buf.c_str()));  // NULLTERM / NULLPAD: up to the first NUL
  }
  return buf;
}

int64_t Location::attr_int(const std::string& name) const {
  Guard guard;
  return read_numeric_attr<int64_t>(*this, name, H5T_NATIVE_INT64, false, "an integer", true)[0];
}

double Location::attr_double(const std::string& name) const {
  Guard guard;
  return read_numeric_attr<double>(*this, name, H5T_NATIVE_DOUBLE, true, "a number", true)[0];
}

std::vector<double> Location::attr_doubles(const std::string& name) const {
  Guard guard;
  return read_numeric_attr<double>(*this, name, H5T_NATIVE_DOUBLE, true, "numbers", false);
}

Group Location::group(const std::string& path) {
  Guard guard;
  if (path_exists(id(), path)) return open_group(path);
  Id lcpl = intermediate_lcpl();
  Id g = DP_H5_ID(H5Gcreate2(id(), path.c_str(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT),
                  "creating group '", child_name(id(), path), "'");
  return Group(std::move(g), child_name(id(), path));
}

Group Location::open_group(const std::string& path) const {
  Guard guard;
  const std::string full = child_name(id(), path);
  DP_CHECK(path_exists(id(), path), "group '", full, "' not found");
  const H5I_type_t kind = object_kind(id(), path);
  DP_CHECK(kind == H5I_GROUP, "'", full, "' is ", kind_name(kind), ", expected a group");
  Id g = DP_H5_ID(H5Gopen2(id(), path.c_str(), H5P_DEFAULT), "opening group '", full, "'");
  return Group(std::move(g), full);
}

namespace {
// H5Literate's and H5Aiterate2's callback: appends the name to a std::vector<std::string>.
template <class Info>
herr_t collect_name(hid_t, const char* name, const Info*, void* data) {
  static_cast<std::vector<std::string>*>(data)->emplace_back(name);
  return 0;
}
}  // namespace

std::vector<std::string> Location::children() const {
  Guard guard;
  std::vector<std::string> names;
  hsize_t index = 0;
  DP_H5_CHECK_MSG(
      H5Literate(id(), H5_INDEX_NAME, H5_ITER_INC, &index, collect_name<H5L_info_t>, &names),
      "listing the children of '", name_, "'");
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> Location::attr_names() const {
  Guard guard;
  std::vector<std::string> names;
  hsize_t index = 0;
  DP_H5_CHECK_MSG(
      H5Aiterate2(id(), H5_INDEX_NAME, H5_ITER_INC, &index, collect_name<H5A_info_t>, &names),
      "listing the attributes of '", name_, "'");
  std::sort(names.begin(), names.end());
  return names;
}

Location::AttrKind Location::attr_kind(const std::string& name) const {
  Guard guard;
  Id attr = open_attr(*this, name);
  Id type = DP_H5_ID(H5Aget_type(attr.get()), "reading the type of attribute '", name, "'");
  switch (H5Tget_class(type.get())) {
    case H5T_INTEGER:
      return AttrKind::kInteger;
    case H5T_FLOAT:
      return AttrKind::kNumber;
    case H5T_STRING:
      return AttrKind::kString;
    default:
      return AttrKind::kOther;
  }
}

// ---------------------------------------------------------------------------------------------
// File

File::File(const std::string& path, Mode mode) : path_(path) {
  Guard guard;
  name_ = path;
  if (mode == Mode::kRead) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
      fail("cannot open HDF5 file '", path, "': ", std::strerror(errno));
    }
    DP_CHECK(!S_ISDIR(st.st_mode), "cannot open HDF5 file '", path, "': it is a directory");
    const htri_t is_hdf5 = H5Fis_hdf5(path.c_str());
    DP_H5_CHECK_MSG(is_hdf5, "cannot open HDF5 file '", path, "'");
    DP_CHECK(is_hdf5 > 0, "cannot open HDF5 file '", path, "': not an HDF5 file");
    // Without HDF5's file lock: reading needs none (every file dptrain and dpprep write is
    // renamed into place whole), and its flock() fails on file systems without locks (Lustre,
    // GPFS, Cray DVS: EOPNOTSUPP or 524), which would otherwise take HDF5_USE_FILE_LOCKING=FALSE.
    Id fapl = DP_H5_ID(H5Pcreate(H5P_FILE_ACCESS), "creating a file access property list");
    DP_H5_CHECK_MSG(H5Pset_file_locking(fapl.get(), false, true),
                    "turning HDF5 file locking off for reading '", path, "'");
    id_ = DP_H5_ID(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), "cannot open HDF5 file '",
                   path, "'");
  } else {
    const size_t slash = path.find_last_of('/');
    if (slash != std::string::npos && slash > 0) {
      const std::string dir = path.substr(0, slash);
      struct stat st {};
      DP_CHECK(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), "cannot create HDF5 file '",
               path, "': directory '", dir, "' does not exist");
    }
    id_ = DP_H5_ID(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT),
                   "cannot create HDF5 file '", path, "'");
  }
}

void File::flush() {
  Guard guard;
  DP_H5_CHECK_MSG(H5Fflush(id(), H5F_SCOPE_GLOBAL), "flushing HDF5 file '", path_, "'");
}

// ---------------------------------------------------------------------------------------------
// Dataset

namespace {

hid_t file_type(Type t) {
  return t == Type::kUint8 ? H5T_STD_U8LE : H5T_IEEE_F32LE;
}
hid_t mem_type(Type t) {
  return t == Type::kUint8 ? H5T_NATIVE_UINT8 : H5T_NATIVE_FLOAT;
}

Id make_space(const std::vector<int64_t>& shape) {
  if (shape.empty()) return scalar_space();
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  return DP_H5_ID(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                  "creating a dataspace");
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += str_cat(i ? "," : "", shape[i]);
  return s + "]";
}

// Bytes of one row if each row of `dset` is one chunk filtered by deflate alone, else 0.
size_t deflated_row_bytes(hid_t dset, const std::vector<int64_t>& shape, const std::string& name) {
  Id dcpl = DP_H5_ID(H5Dget_create_plist(dset), "reading the creation properties of '", name, "'");
  if (shape.empty() || H5Pget_layout(dcpl.get()) != H5D_CHUNKED ||
      H5Pget_nfilters(dcpl.get()) != 1) {
    return 0;
  }
  unsigned flags = 0;
  size_t n_values = 0;
  if (H5Pget_filter2(dcpl.get(), 0, &flags, &n_values, nullptr, 0, nullptr, nullptr) !=
      H5Z_FILTER_DEFLATE) {
    return 0;
  }
  std::vector<hsize_t> chunk(shape.size());
  if (H5Pget_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()) !=
          static_cast<int>(shape.size()) ||
      chunk[0] != 1) {
    return 0;
  }
  size_t bytes = 1;
  for (size_t d = 1; d < shape.size(); ++d) {
    if (chunk[d] != static_cast<hsize_t>(shape[d])) return 0;
    bytes *= static_cast<size_t>(chunk[d]);
  }
  return bytes;
}

// HDF5 refuses to create chunks larger than a fixed dimension but reads files that have them,
// and then copies past the caller's buffer (HDF5 1.10.8; found by fuzzing): refused before any
// read. Also every chunk dimension is at least 1 and the chunk's rank is the dataset's.
void check_chunks(hid_t dset, hid_t space, const std::vector<hsize_t>& dims,
                  const std::string& name) {
  Id dcpl = DP_H5_ID(H5Dget_create_plist(dset), "reading the creation properties of '", name, "'");
  if (H5Pget_layout(dcpl.get()) != H5D_CHUNKED) return;
  hsize_t chunk[H5S_MAX_RANK] = {};
  const int rank = H5Pget_chunk(dcpl.get(), H5S_MAX_RANK, chunk);
  DP_H5_CHECK_MSG(rank, "reading the chunk shape of '", name, "'");
  std::vector<hsize_t> max_dims(dims.size());
  if (!dims.empty()) {
    DP_H5_CHECK_MSG(H5Sget_simple_extent_dims(space, nullptr, max_dims.data()),
                    "reading the maximum shape of '", name, "'");
  }
  bool fits = static_cast<size_t>(rank) == dims.size();
  std::string text;
  for (int i = 0; i < std::min(rank, H5S_MAX_RANK); ++i) {
    text += str_cat(i ? "," : "", chunk[i]);
    if (fits) {
      fits = chunk[i] >= 1 && (max_dims[static_cast<size_t>(i)] == H5S_UNLIMITED ||
                               chunk[i] <= std::max<hsize_t>(max_dims[static_cast<size_t>(i)], 1));
    }
  }
  std::string shape;
  for (hsize_t d : dims) shape += str_cat(shape.empty() ? "" : ",", d);
  DP_CHECK(fits, "dataset '", name, "' has chunks [", text, "] that do not fit its shape [", shape,
           "]: the file is corrupt or forged");
}

}  // namespace

Dataset::Dataset(Id id, std::string name) {
  Guard guard;
  Id space = DP_H5_ID(H5Dget_space(id.get()), "reading the dataspace of '", name, "'");
  const int rank = H5Sget_simple_extent_ndims(space.get());
  DP_H5_CHECK_MSG(rank, "reading the rank of '", name, "'");
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  if (rank > 0) {
    DP_H5_CHECK_MSG(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr),
                    "reading the shape of '", name, "'");
  }
  // The element count must fit kMaxElements (no int64 overflow in numel() or in byte counts).
  hsize_t elements = 1;
  std::string dims_text;
  for (hsize_t d : dims) dims_text += str_cat(dims_text.empty() ? "" : ",", d);
  for (hsize_t d : dims) {
    DP_CHECK(d <= static_cast<hsize_t>(kMaxElements) &&
                 (d == 0 || elements <= static_cast<hsize_t>(kMaxElements) / d),
             "dataset '", name, "' has shape [", dims_text, "], more than ", kMaxElements,
             " elements");
    elements *= d;
  }
  shape_.assign(dims.begin(), dims.end());
  check_chunks(id.get(), space.get(), dims, name);
  Id type = DP_H5_ID(H5Dget_type(id.get()), "reading the type of '", name, "'");
  const H5T_class_t cls = H5Tget_class(type.get());
  const size_t size = H5Tget_size(type.get());
  constexpr size_t kFloat32Bytes = 4;
  if (cls == H5T_INTEGER && size == 1 && H5Tget_sign(type.get()) == H5T_SGN_NONE) {
    type_ = Type::kUint8;
  } else if (cls == H5T_FLOAT && size == kFloat32Bytes) {
    type_ = Type::kFloat32;
  } else {
    fail("dataset '", name, "' has type ", type_name(type.get()), ", expected uint8 or float32");
  }
  if (type_ == Type::kUint8) deflated_row_bytes_ = deflated_row_bytes(id.get(), shape_, name);
  attrs_ = Attrs(std::move(id), std::move(name));
}

Dataset Dataset::create(Location& loc, const std::string& path, Type type,
                        const std::vector<int64_t>& shape, const std::vector<int64_t>& chunk,
                        int gzip_level) {
  Guard guard;
  const std::string full = child_name(loc.id(), path);
  constexpr int kMaxGzip = 9;
  DP_CHECK(gzip_level >= 0 && gzip_level <= kMaxGzip, "dataset '", full, "': gzip level ",
           gzip_level, " out of range [0, ", kMaxGzip, "]");
  DP_CHECK(gzip_level == 0 || !chunk.empty(), "dataset '", full,
           "': gzip compression needs a chunk shape");
  DP_CHECK(chunk.empty() || chunk.size() == shape.size(), "dataset '", full, "': chunk ",
           shape_str(chunk), " does not match the rank of shape ", shape_str(shape));
  for (int64_t d : shape) DP_CHECK(d >= 0, "dataset '", full, "': bad shape ", shape_str(shape));
  for (int64_t d : chunk) DP_CHECK(d > 0, "dataset '", full, "': bad chunk ", shape_str(chunk));
  DP_CHECK(!path_exists(loc.id(), path), "cannot create dataset '", full, "': it already exists");

  Id space = make_space(shape);
  Id dcpl = DP_H5_ID(H5Pcreate(H5P_DATASET_CREATE), "creating a dataset property list");
  if (!chunk.empty()) {
    std::vector<hsize_t> cdims(chunk.begin(), chunk.end());
    DP_H5_CHECK_MSG(H5Pset_chunk(dcpl.get(), static_cast<int>(cdims.size()), cdims.data()),
                    "setting chunk ", shape_str(chunk), " of '", full, "'");
    if (gzip_level > 0) {
      DP_H5_CHECK_MSG(H5Pset_deflate(dcpl.get(), static_cast<unsigned>(gzip_level)),
                      "enabling gzip for '", full, "'");
    }
  }
  Id lcpl = intermediate_lcpl();
  Id id = DP_H5_ID(H5Dcreate2(loc.id(), path.c_str(), file_type(type), space.get(), lcpl.get(),
                              dcpl.get(), H5P_DEFAULT),
                   "creating dataset '", full, "'");
  return Dataset(std::move(id), full);
}

Dataset Dataset::open(const Location& loc, const std::string& path) {
  Guard guard;
  const std::string full = child_name(loc.id(), path);
  DP_CHECK(path_exists(loc.id(), path), "dataset '", full, "' not found");
  const H5I_type_t kind = object_kind(loc.id(), path);
  DP_CHECK(kind == H5I_DATASET, "'", full, "' is ", kind_name(kind), ", expected a dataset");
  Id id = DP_H5_ID(H5Dopen2(loc.id(), path.c_str(), H5P_DEFAULT), "opening dataset '", full, "'");
  return Dataset(std::move(id), full);
}

int64_t Dataset::numel() const {
  return std::accumulate(shape_.begin(), shape_.end(), int64_t{1}, std::multiplies<int64_t>());
}

Location& Dataset::attrs() {
  return attrs_;
}

void Dataset::check_stored() const {
  Guard guard;
  const hid_t id = attrs_.id();
  const int64_t element_bytes = type_ == Type::kUint8 ? 1 : 4;
  const int64_t need = numel() * element_bytes;  // numel() <= kMaxElements: no overflow
  // Filters deflate, shuffle and fletcher32 shrink data by at most kMaxDeflateRatio; any other
  // (not written by dptrain) gives no bound.
  Id dcpl = DP_H5_ID(H5Dget_create_plist(id), "reading the creation properties of '", name(), "'");
  const int filters = H5Pget_nfilters(dcpl.get());
  DP_H5_CHECK_MSG(filters, "reading the filters of '", name(), "'");
  int64_t least = need;
  for (int i = 0; i < filters; ++i) {
    unsigned flags = 0;
    size_t n_values = 0;
    const H5Z_filter_t f = H5Pget_filter2(dcpl.get(), static_cast<unsigned>(i), &flags, &n_values,
                                          nullptr, 0, nullptr, nullptr);
    DP_H5_CHECK_MSG(f, "reading the filters of '", name(), "'");
    if (f == H5Z_FILTER_DEFLATE) {
      least = std::min(least, (need + kMaxDeflateRatio - 1) / kMaxDeflateRatio);
    } else if (f != H5Z_FILTER_SHUFFLE && f != H5Z_FILTER_FLETCHER32) {
      least = std::min<int64_t>(least, need > 0 ? 1 : 0);
    }
  }
  const auto stored = static_cast<int64_t>(H5Dget_storage_size(id));  // 0 also on error
  H5Eclear2(H5E_DEFAULT);
  const int64_t file_bytes = readonly_file_bytes(id);
  DP_CHECK(file_bytes < 0 || stored <= file_bytes, "dataset '", name(), "' claims ", stored,
           " bytes of data, more than its file holds (", file_bytes, " bytes)");
  DP_CHECK(stored >= least, "dataset '", name(), "' of shape ", shape_str(shape_), " holds ",
           stored, " bytes of data, but its ", numel(), " elements need at least ", least,
           ": the file is truncated or forged, or rows were never written");
}

namespace {

void require_type(Type have, Type want, const std::string& name, const char* op) {
  DP_CHECK(have == want, "cannot ", op, " dataset '", name, "' of type ", type_name(have), " as ",
           type_name(want));
}

void check_rows(const std::vector<int64_t>& shape, int64_t first, int64_t count,
                const std::string& name) {
  DP_CHECK(!shape.empty(), "dataset '", name, "' is a scalar and has no rows");
  DP_CHECK(first >= 0 && count >= 0 && first <= shape[0] - count, "rows [", first, ", ",
           first + count, ") out of range for dataset '", name, "' with ", shape[0], " rows");
}

// Selects rows [first, first+count) of `shape` in `file_space`; returns the matching memory space.
Id select_rows(hid_t file_space, const std::vector<int64_t>& shape, int64_t first, int64_t count,
               const std::string& name) {
  std::vector<hsize_t> start(shape.size(), 0), dims(shape.begin(), shape.end());
  start[0] = static_cast<hsize_t>(first);
  dims[0] = static_cast<hsize_t>(count);
  DP_H5_CHECK_MSG(
      H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start.data(), nullptr, dims.data(), nullptr),
      "selecting rows of '", name, "'");
  return DP_H5_ID(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                  "creating a memory dataspace");
}

}  // namespace

void Dataset::write(const float* data) {
  Guard guard;
  require_type(type_, Type::kFloat32, name(), "write");
  DP_H5_CHECK_MSG(H5Dwrite(attrs_.id(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data),
                  "writing dataset '", name(), "'");
}

void Dataset::write(const uint8_t* data) {
  Guard guard;
  require_type(type_, Type::kUint8, name(), "write");
  DP_H5_CHECK_MSG(H5Dwrite(attrs_.id(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, data),
                  "writing dataset '", name(), "'");
}

void Dataset::read(float* data) const {
  Guard guard;
  require_type(type_, Type::kFloat32, name(), "read");
  DP_H5_CHECK_MSG(H5Dread(attrs_.id(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data),
                  "reading dataset '", name(), "'");
}

void Dataset::read(uint8_t* data) const {
  Guard guard;
  require_type(type_, Type::kUint8, name(), "read");
  DP_H5_CHECK_MSG(H5Dread(attrs_.id(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, data),
                  "reading dataset '", name(), "'");
}

void Dataset::write_rows(int64_t first, int64_t count, const uint8_t* data) {
  Guard guard;
  require_type(type_, Type::kUint8, name(), "write");
  check_rows(shape_, first, count, name());
  if (count == 0) return;
  Id file_space = DP_H5_ID(H5Dget_space(attrs_.id()), "reading the dataspace of '", name(), "'");
  Id mem_space = select_rows(file_space.get(), shape_, first, count, name());
  DP_H5_CHECK_MSG(
      H5Dwrite(attrs_.id(), mem_type(type_), mem_space.get(), file_space.get(), H5P_DEFAULT, data),
      "writing rows [", first, ", ", first + count, ") of dataset '", name(), "'");
}

void Dataset::read_rows(int64_t first, int64_t count, uint8_t* data) const {
  if (count == 1 && deflated_row_bytes_ > 0) {
    check_rows(shape_, first, count, name());
    read_deflated_row(first, data);
  } else {
    read_rows_as(Type::kUint8, first, count, data);
  }
}

void Dataset::read_rows(int64_t first, int64_t count, float* data) const {
  read_rows_as(Type::kFloat32, first, count, data);
}

void Dataset::read_rows_as(Type type, int64_t first, int64_t count, void* data) const {
  Guard guard;
  require_type(type_, type, name(), "read");
  check_rows(shape_, first, count, name());
  if (count == 0) return;
  Id file_space = DP_H5_ID(H5Dget_space(attrs_.id()), "reading the dataspace of '", name(), "'");
  Id mem_space = select_rows(file_space.get(), shape_, first, count, name());
  DP_H5_CHECK_MSG(
      H5Dread(attrs_.id(), mem_type(type_), mem_space.get(), file_space.get(), H5P_DEFAULT, data),
      "reading rows [", first, ", ", first + count, ") of dataset '", name(), "'");
}

// The raw chunk is read under the lock into this thread's buffer, then inflated without the lock.
void Dataset::read_deflated_row(int64_t row, uint8_t* data) const {
  thread_local std::vector<uint8_t> chunk;  // grows to the largest compressed row, never shrinks
  hsize_t offset[H5S_MAX_RANK] = {static_cast<hsize_t>(row)};
  hsize_t size = 0;
  uint32_t filters = 0;
  {
    Guard guard;
    // A row never written has no chunk (size 0, or an error from HDF5 1.10): H5Dread gives the
    // fill value, or HDF5's own error.
    if (H5Dget_chunk_storage_size(attrs_.id(), offset, &size) < 0 || size == 0) {
      H5Eclear2(H5E_DEFAULT);
      read_rows_as(Type::kUint8, row, 1, data);
      return;
    }
    if (chunk.size() < size) chunk.resize(size);
    DP_H5_CHECK_MSG(H5Dread_chunk(attrs_.id(), H5P_DEFAULT, offset, &filters, chunk.data()),
                    "reading the chunk of row ", row, " of dataset '", name(), "'");
  }
  const size_t want = deflated_row_bytes_;
  if (filters & 1u) {  // deflate skipped (it failed when written, or direct write): the raw row
    DP_CHECK(size == want, "dataset '", name(), "': row ", row, " is stored uncompressed in ", size,
             " bytes, expected ", want);
    std::memcpy(data, chunk.data(), want);
    return;
  }
  uLongf out = want;
  const int rc = uncompress(data, &out, chunk.data(), size);
  if (rc != Z_OK || out != want) {
    fail("dataset '", name(), "': cannot inflate row ", row, " (", size, " bytes compressed): ",
         rc == Z_OK ? str_cat("it inflates to ", out, " bytes") : str_cat("zlib ", zError(rc)),
         ", expected a zlib stream of ", want, " bytes");
  }
}

}  // namespace dp::h5
