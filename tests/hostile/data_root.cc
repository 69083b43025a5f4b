#include "tests/hostile/data_root.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "src/data/dataset.h"
#include "src/common/file_util.h"
#include "src/common/status_macros.h"

namespace dynapipe::testing::hostile {
namespace {

namespace fs = std::filesystem;

absl::Status Write(const std::string& path, absl::string_view bytes) {
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  return WriteFileAtomic(path, bytes);
}

absl::Status Fifo(const std::string& path) {
  if (::mkfifo(path.c_str(), 0600) != 0) return absl::InternalError(absl::StrCat("mkfifo ", path));
  return absl::OkStatus();
}

absl::Status Link(const std::string& target, const std::string& path) {
  std::error_code ec;
  fs::create_symlink(target, path, ec);
  if (ec) return absl::InternalError(absl::StrCat("symlink ", path, ": ", ec.message()));
  return absl::OkStatus();
}

absl::Status Sparse(const std::string& path, uint64_t size, absl::string_view head = "") {
  RETURN_IF_ERROR(Write(path, head));
  if (::truncate(path.c_str(), static_cast<off_t>(size)) != 0) return absl::InternalError("truncate " + path);
  return absl::OkStatus();
}

// A small valid dataset: vocab 16, two tasks.
absl::Status WriteValidDataset(const std::string& dir) {
  proto::DatasetInfo info;
  info.set_vocab(16);
  info.add_tasks("t0");
  info.add_tasks("t1");
  info.set_source("hostile_inputs_test");
  ASSIGN_OR_RETURN(auto w, data::DatasetWriter::Create(dir, info));
  std::mt19937 rng(7);
  for (int i = 0; i < 40; ++i) {
    std::vector<uint32_t> in(4 + rng() % 60), out(1 + rng() % 8);
    for (auto& t : in) t = 3 + rng() % 13;
    for (auto& t : out) t = 3 + rng() % 13;
    RETURN_IF_ERROR(w->Add(in, out, static_cast<uint32_t>(i % 2)));
  }
  return w->Finish();
}

// `text` (a dataset.pbtxt) with `field` set to `value`: its line replaced,
// or appended when it has none.
std::string SetField(const std::string& text, const std::string& field, const std::string& value) {
  std::string out;
  bool found = false;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (absl::StartsWith(line, field + ":")) {
      absl::StrAppend(&out, field, ": ", value, "\n");
      found = true;
    } else {
      absl::StrAppend(&out, line, "\n");
    }
  }
  if (!found) absl::StrAppend(&out, field, ": ", value, "\n");
  return out;
}

template <typename T>
void Put(std::string* bytes, size_t at, T value) {
  std::memcpy(bytes->data() + at, &value, sizeof(T));
}

constexpr size_t kIdxHeader = 32, kRecord = 24;

}  // namespace

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng() & 0xff);
  return s;
}

absl::StatusOr<DataRoot> MakeDataRoot(const std::string& dir, const std::string& lengths_corpus) {
  DataRoot d;
  d.root = dir + "/root";
  d.outside = dir + "/outside";
  const std::string& R = d.root;
  std::error_code ec;
  fs::create_directories(R + "/adir", ec);
  fs::create_directories(d.outside + "/dir", ec);
  fs::create_directories(dir + "/root2", ec);
  if (ec) return absl::InternalError(ec.message());

  // Valid inputs, and files the paths below name.
  std::string lengths;
  std::mt19937 rng(11);
  for (int i = 0; i < 400; ++i) absl::StrAppend(&lengths, 16 + rng() % 900, " ", 1 + rng() % 200, "\n");
  RETURN_IF_ERROR(Write(R + "/lengths.txt", lengths));
  std::string many;
  for (int i = 0; i < 20000; ++i) absl::StrAppend(&many, 2 + i % 2, " 1\n");
  RETURN_IF_ERROR(Write(R + "/" + d.many_short, many));
  RETURN_IF_ERROR(Write(d.outside + "/secret.txt", "12 3\n45 6\n"));  // a valid lengths file, outside
  RETURN_IF_ERROR(Write(dir + "/root2/lengths.txt", "12 3\n"));
  RETURN_IF_ERROR(Write(R + "/file.txt", "12 3\n"));
  RETURN_IF_ERROR(WriteValidDataset(R + "/ds"));
  RETURN_IF_ERROR(WriteValidDataset(d.outside + "/ds"));
  RETURN_IF_ERROR(Fifo(R + "/fifo"));
  RETURN_IF_ERROR(Link(d.outside + "/secret.txt", R + "/link-out"));
  RETURN_IF_ERROR(Link(d.outside + "/dir", R + "/link-dir-out"));
  RETURN_IF_ERROR(Write(d.outside + "/dir/lengths.txt", "12 3\n"));
  RETURN_IF_ERROR(Link(R + "/link-loop-b", R + "/link-loop-a"));
  RETURN_IF_ERROR(Link(R + "/link-loop-a", R + "/link-loop-b"));
  RETURN_IF_ERROR(Link("/nonexistent-hostile-target/x", R + "/link-dangling"));
  RETURN_IF_ERROR(Link("/dev/zero", R + "/link-devzero"));
  RETURN_IF_ERROR(Link("../outside/ds", R + "/link-ds-out"));
  RETURN_IF_ERROR(Sparse(R + "/sparse-1g.txt", (uint64_t{1} << 30) + 1, "12 3\n"));

  // Lengths files: the checked-in corpus, then generated ones.
  for (const auto& e : fs::directory_iterator(lengths_corpus, ec)) {
    const std::string name = e.path().filename().string();
    ASSIGN_OR_RETURN(const std::string text, ReadFile(e.path().string()));
    RETURN_IF_ERROR(Write(R + "/lengths/" + name, text));
    d.bad_lengths.push_back({"corpus/lengths/" + name, "lengths/" + name});
  }
  if (ec) return absl::InternalError(absl::StrCat(lengths_corpus, ": ", ec.message()));
  std::sort(d.bad_lengths.begin(), d.bad_lengths.end(), [](auto& a, auto& b) { return a.name < b.name; });
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    const std::string path = absl::StrCat("lengths/gen-binary-", seed, ".txt");
    RETURN_IF_ERROR(Write(R + "/" + path, RandomBytes(200 + 50 * seed, seed)));
    d.bad_lengths.push_back({absl::StrCat(200 + 50 * seed, " random bytes (seed ", seed, ")"), path});
  }
  RETURN_IF_ERROR(Write(R + "/lengths/gen-1mb-digits.txt", std::string(1 << 20, '9') + "\n"));
  d.bad_lengths.push_back({"one line of 1 MB of digits", "lengths/gen-1mb-digits.txt"});
  RETURN_IF_ERROR(Write(R + "/lengths/gen-nul.txt", std::string("12 3\n4\0 5\n", 10)));
  d.bad_lengths.push_back({"a NUL inside a number", "lengths/gen-nul.txt"});
  RETURN_IF_ERROR(Write(R + "/lengths/gen-utf16.txt", std::string("\xff\xfe" "1\0" "2\0 \0" "3\0\n\0", 12)));
  d.bad_lengths.push_back({"UTF-16 text", "lengths/gen-utf16.txt"});
  d.bad_lengths.push_back({"sparse file of 1 GiB + 1 byte", "sparse-1g.txt"});
  d.bad_lengths.push_back({"a FIFO", "fifo"});
  d.bad_lengths.push_back({"a directory", "adir"});
  d.bad_lengths.push_back({"symlink to /dev/zero", "link-devzero"});
  d.bad_lengths.push_back({"nonexistent file", "lengths/does-not-exist.txt"});

  RETURN_IF_ERROR(Write(R + "/lengths-edge.txt",
                        "# comment\r\n9223372036854775807 9223372036854775807\r\n\t 7 , 0 # trailing\n1\n"));
  d.good_lengths.push_back({"lengths 2^63-1, CRLF, tabs, commas, comments", "lengths-edge.txt"});

  // Datasets: the valid one's files, then corrupted copies.
  ASSIGN_OR_RETURN(const std::string info, ReadFile(R + "/ds/dataset.pbtxt"));
  ASSIGN_OR_RETURN(const std::string index, ReadFile(R + "/ds/index.bin"));
  ASSIGN_OR_RETURN(const std::string tokens, ReadFile(R + "/ds/tokens.bin"));
  uint64_t samples, ntokens;
  std::memcpy(&samples, index.data() + 16, 8);
  std::memcpy(&ntokens, index.data() + 24, 8);
  int next_dir = 0;
  const std::string kGone = "\x01gone";  // a corruption's marker: leave this file out
  auto dataset = [&](const std::string& name, std::vector<FileCase>* into,
                     const std::function<absl::Status(const std::string& dir, std::string* info, std::string* index,
                                                      std::string* tokens)>& corrupt) -> absl::Status {
    const std::string rel = absl::StrCat("datasets/", next_dir++);
    const std::string dir = R + "/" + rel;
    fs::create_directories(dir, ec);
    std::string i = info, x = index, t = tokens;
    RETURN_IF_ERROR(corrupt(dir, &i, &x, &t));
    for (const auto& [file, bytes] : {std::pair{"dataset.pbtxt", &i}, {"index.bin", &x}, {"tokens.bin", &t}}) {
      const std::string p = dir + "/" + file;
      if (*bytes == kGone || fs::exists(fs::symlink_status(p))) continue;  // left out, or made by `corrupt`
      RETURN_IF_ERROR(Write(p, *bytes));
    }
    into->push_back({name, rel});
    return absl::OkStatus();
  };
  auto bad = [&](const std::string& name, const auto& corrupt) { return dataset(name, &d.bad_datasets, corrupt); };
  using S = std::string;
  std::vector<std::pair<std::string, std::function<absl::Status(const S&, S*, S*, S*)>>> cases = {
      {"dataset.pbtxt missing", [&](const S&, S* i, S*, S*) { *i = kGone; return absl::OkStatus(); }},
      {"index.bin missing", [&](const S&, S*, S* x, S*) { *x = kGone; return absl::OkStatus(); }},
      {"tokens.bin missing", [&](const S&, S*, S*, S* t) { *t = kGone; return absl::OkStatus(); }},
      {"dataset.pbtxt: 300 random bytes", [&](const S&, S* i, S*, S*) { *i = RandomBytes(300, 21); return absl::OkStatus(); }},
      {"dataset.pbtxt: does not parse", [&](const S&, S* i, S*, S*) { *i = "num_samples: {\n"; return absl::OkStatus(); }},
      {"dataset.pbtxt: unknown field", [&](const S&, S* i, S*, S*) { *i += "bogus_field: 1\n"; return absl::OkStatus(); }},
      {"dataset.pbtxt: empty", [&](const S&, S* i, S*, S*) { *i = "# nothing\n"; return absl::OkStatus(); }},
      {"dataset.pbtxt: num_samples one more than index.bin",
       [&](const S&, S* i, S*, S*) { *i = SetField(*i, "num_samples", absl::StrCat(samples + 1)); return absl::OkStatus(); }},
      {"dataset.pbtxt: num_tokens other than index.bin and tokens.bin",
       [&](const S&, S* i, S*, S*) { *i = SetField(*i, "num_tokens", absl::StrCat(ntokens + 1000)); return absl::OkStatus(); }},
      {"dataset.pbtxt: format_version 2", [&](const S&, S* i, S*, S*) { *i = SetField(*i, "format_version", "2"); return absl::OkStatus(); }},
      {"dataset.pbtxt: vocab 0", [&](const S&, S* i, S*, S*) { *i = SetField(*i, "vocab", "0"); return absl::OkStatus(); }},
      {"dataset.pbtxt: no tasks", [&](const S&, S* i, S*, S*) {
         std::string out;
         for (absl::string_view line : absl::StrSplit(*i, '\n')) {
           if (!absl::StartsWith(line, "tasks:")) absl::StrAppend(&out, line, "\n");
         }
         *i = out;
         return absl::OkStatus();
       }},
      {"dataset.pbtxt: num_samples 2^64-1", [&](const S&, S* i, S*, S*) { *i = SetField(*i, "num_samples", "18446744073709551615"); return absl::OkStatus(); }},
      {"dataset.pbtxt is a FIFO", [&](const S& dir, S* i, S*, S*) { *i = kGone; return Fifo(dir + "/dataset.pbtxt"); }},
      {"dataset.pbtxt is a directory", [&](const S& dir, S* i, S*, S*) { *i = kGone; fs::create_directory(dir + "/dataset.pbtxt"); return absl::OkStatus(); }},
      {"dataset.pbtxt is a link to /dev/zero", [&](const S& dir, S* i, S*, S*) { *i = kGone; return Link("/dev/zero", dir + "/dataset.pbtxt"); }},
      {"index.bin: empty", [&](const S&, S*, S* x, S*) { x->clear(); return absl::OkStatus(); }},
      {"index.bin: 31 bytes", [&](const S&, S*, S* x, S*) { x->resize(31); return absl::OkStatus(); }},
      {"index.bin: wrong magic", [&](const S&, S*, S* x, S*) { (*x)[0] = 'X'; return absl::OkStatus(); }},
      {"index.bin: format version 2", [&](const S&, S*, S* x, S*) { Put<uint32_t>(x, 8, 2); return absl::OkStatus(); }},
      {"index.bin: sample count + 1", [&](const S&, S*, S* x, S*) { Put<uint64_t>(x, 16, samples + 1); return absl::OkStatus(); }},
      {"index.bin: sample count 2^61 (x 24 bytes wraps)", [&](const S&, S*, S* x, S*) { Put<uint64_t>(x, 16, uint64_t{1} << 61); return absl::OkStatus(); }},
      {"index.bin: sample count 2^64-1", [&](const S&, S*, S* x, S*) { Put<uint64_t>(x, 16, ~uint64_t{0}); return absl::OkStatus(); }},
      {"index.bin: token count + 1", [&](const S&, S*, S* x, S*) { Put<uint64_t>(x, 24, ntokens + 1); return absl::OkStatus(); }},
      {"index.bin: token count 2^64-1", [&](const S&, S*, S* x, S*) { Put<uint64_t>(x, 24, ~uint64_t{0}); return absl::OkStatus(); }},
      {"index.bin: truncated mid-record", [&](const S&, S*, S* x, S*) { x->resize(x->size() - 10); return absl::OkStatus(); }},
      {"index.bin: 7 trailing bytes", [&](const S&, S*, S* x, S*) { x->append(7, '\0'); return absl::OkStatus(); }},
      {"index.bin: one extra record", [&](const S&, S*, S* x, S*) { x->append(x->substr(kIdxHeader, kRecord)); return absl::OkStatus(); }},
      {"index.bin: record 0 offset 1", [&](const S&, S*, S* x, S*) { Put<uint64_t>(x, kIdxHeader, 1); return absl::OkStatus(); }},
      {"index.bin: last record's offset past the end", [&](const S&, S*, S* x, S*) { Put<uint64_t>(x, kIdxHeader + (samples - 1) * kRecord, ntokens + 5); return absl::OkStatus(); }},
      {"index.bin: record 0 input_len 0", [&](const S&, S*, S* x, S*) { Put<uint32_t>(x, kIdxHeader + 8, 0); return absl::OkStatus(); }},
      {"index.bin: record 0 input_len 2^32-1", [&](const S&, S*, S* x, S*) { Put<uint32_t>(x, kIdxHeader + 8, ~uint32_t{0}); return absl::OkStatus(); }},
      {"index.bin: record 0 target_len 2^32-1", [&](const S&, S*, S* x, S*) { Put<uint32_t>(x, kIdxHeader + 12, ~uint32_t{0}); return absl::OkStatus(); }},
      {"index.bin: record 0 lengths 2^31 + 2^31 (sum wraps 32 bits)", [&](const S&, S*, S* x, S*) {
         Put<uint32_t>(x, kIdxHeader + 8, 1u << 31);
         Put<uint32_t>(x, kIdxHeader + 12, 1u << 31);
         return absl::OkStatus();
       }},
      {"index.bin: record 0 task 7 (unknown)", [&](const S&, S*, S* x, S*) { Put<uint32_t>(x, kIdxHeader + 16, 7); return absl::OkStatus(); }},
      {"index.bin: 300 random bytes after the header", [&](const S&, S*, S* x, S*) { *x = x->substr(0, kIdxHeader) + RandomBytes(300, 22); return absl::OkStatus(); }},
      {"index.bin is a FIFO", [&](const S& dir, S*, S* x, S*) { *x = kGone; return Fifo(dir + "/index.bin"); }},
      {"index.bin is a directory", [&](const S& dir, S*, S* x, S*) { *x = kGone; fs::create_directory(dir + "/index.bin"); return absl::OkStatus(); }},
      {"index.bin is a link to /dev/zero", [&](const S& dir, S*, S* x, S*) { *x = kGone; return Link("/dev/zero", dir + "/index.bin"); }},
      {"index.bin: sparse 2 GiB", [&](const S& dir, S*, S* x, S*) { *x = kGone; return Sparse(dir + "/index.bin", uint64_t{2} << 30, index.substr(0, kIdxHeader)); }},
      {"tokens.bin: empty", [&](const S&, S*, S*, S* t) { t->clear(); return absl::OkStatus(); }},
      {"tokens.bin: 7 bytes", [&](const S&, S*, S*, S* t) { t->resize(7); return absl::OkStatus(); }},
      {"tokens.bin: wrong magic", [&](const S&, S*, S*, S* t) { (*t)[7] = '2'; return absl::OkStatus(); }},
      {"tokens.bin: one token short", [&](const S&, S*, S*, S* t) { t->resize(t->size() - 4); return absl::OkStatus(); }},
      {"tokens.bin: one byte short", [&](const S&, S*, S*, S* t) { t->resize(t->size() - 1); return absl::OkStatus(); }},
      {"tokens.bin: one token extra", [&](const S&, S*, S*, S* t) { t->append(4, '\0'); return absl::OkStatus(); }},
      {"tokens.bin is a FIFO", [&](const S& dir, S*, S*, S* t) { *t = kGone; return Fifo(dir + "/tokens.bin"); }},
      {"tokens.bin is a link to /dev/zero", [&](const S& dir, S*, S*, S* t) { *t = kGone; return Link("/dev/zero", dir + "/tokens.bin"); }},
      {"tokens.bin: sparse 2 GiB", [&](const S& dir, S*, S*, S* t) { *t = kGone; return Sparse(dir + "/tokens.bin", uint64_t{2} << 30, tokens.substr(0, 8)); }},
  };
  for (auto& [name, corrupt] : cases) RETURN_IF_ERROR(bad(name, corrupt));
  d.bad_datasets.push_back({"nonexistent directory", "datasets/does-not-exist"});
  d.bad_datasets.push_back({"empty directory", "adir"});
  d.bad_datasets.push_back({"a regular file", "file.txt"});
  // Outside the root is garbage only for a planner (the CLI has no root).
  d.bad_datasets_planner_only.push_back({"a link to a dataset outside the root", "link-ds-out"});
  RETURN_IF_ERROR(dataset("all three files are links to a dataset outside the root", &d.bad_datasets_planner_only,
                          [&](const S& dir, S* i, S* x, S* t) {
                            *i = *x = *t = kGone;
                            for (const char* f : {"dataset.pbtxt", "index.bin", "tokens.bin"}) {
                              RETURN_IF_ERROR(Link(d.outside + "/ds/" + f, dir + "/" + f));
                            }
                            return absl::OkStatus();
                          }));
  RETURN_IF_ERROR(dataset("dataset.pbtxt: vocab 4, token ids up to 15", &d.bad_datasets_cli_only,
                          [&](const S&, S* i, S*, S*) { *i = SetField(*i, "vocab", "4"); return absl::OkStatus(); }));
  RETURN_IF_ERROR(dataset("dataset.pbtxt: vocab 2^32-1, over model.vocab", &d.bad_datasets_planner_only,
                          [&](const S&, S* i, S*, S*) { *i = SetField(*i, "vocab", "4294967295"); return absl::OkStatus(); }));

  // Paths a job may name: garbage for the fields in `fields`.
  const unsigned kAll = kAllPathFields, kNotCkpt = kAll & ~kCheckpointDir;
  const std::string long_path = [] {
    std::string p;
    while (p.size() < 5000) p += "aaaaaaaa/";
    return p + "x";
  }();
  d.bad_paths = {
      {"../ escaping the root", "../outside/secret.txt", kAll},
      {"adir/../../ escaping the root", "adir/../../outside/secret.txt", kAll},
      {"./../ escaping the root", "./../outside/secret.txt", kAll},
      {"absolute path outside the root", d.outside + "/secret.txt", kAll},
      {"absolute root path with ../ out", R + "/../outside/secret.txt", kAll},
      {"/etc/passwd", "/etc/passwd", kAll},
      {"//etc//passwd", "//etc//passwd", kAll},
      {"sibling directory sharing the root's name as a prefix", R + "2/lengths.txt", kAll},
      {"symlink to a file outside the root", "link-out", kAll},
      {"symlink to a directory outside the root, then a file", "link-dir-out/lengths.txt", kAll},
      {"symlink to a dataset outside the root", "link-ds-out", kAll},
      {"symlink loop", "link-loop-a", kAll},
      {"dangling symlink out of the root", "link-dangling", kAll},
      {"symlink to /dev/zero", "link-devzero", kAll},
      {"/dev/zero", "/dev/zero", kAll},
      {"a FIFO", "fifo", kAll},
      {"a directory", "adir", kNotCkpt},
      {"the root itself", ".", kNotCkpt},
      {"nonexistent", "does-not-exist", kNotCkpt},
      {"empty", "", kLengthsPath | kIndexedPath},
      {"a NUL byte", std::string("file.txt\0.x", 11), kAll},
      {"a newline", "file\n.txt", kAll},
      {"an escape character", "file\x1b.txt", kAll},
      {"5000 bytes", long_path, kAll},
      {"a 300-byte component", std::string(300, 'c'), kAll},
      {"a file used as a directory", "file.txt/x", kAll},
      {"sparse file of 1 GiB + 1 byte", "sparse-1g.txt", kAll},
  };
  return d;
}

std::vector<PathCase> PermissiveRootPaths(const std::string& fifo) {
  const unsigned kAll = kAllPathFields;
  return {
      {"/dev/zero", "/dev/zero", kAll},
      {"/dev/urandom", "/dev/urandom", kAll},
      {"/dev/full", "/dev/full", kAll},
      {"/dev/stdin", "/dev/stdin", kAll},
      {"an absolute FIFO", fifo, kAll},
      {"/proc/self/mem", "/proc/self/mem", kAll},
      {"/proc/self/environ", "/proc/self/environ", kAll},
      {"/proc/self/fd/0", "/proc/self/fd/0", kAll},
      {"/proc (a directory)", "/proc", kAll & ~kCheckpointDir},
  };
}

}  // namespace dynapipe::testing::hostile
