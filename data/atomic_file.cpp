#include "data/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace q4t {

void write_file_atomic(const std::string& path, std::string_view contents) {
  std::vector<char> tmp(path.begin(), path.end());
  const std::string suffix = ".tmp-XXXXXX";
  tmp.insert(tmp.end(), suffix.begin(), suffix.end());
  tmp.push_back('\0');
  const int fd = mkstemp(tmp.data());
  if (fd < 0) throw std::runtime_error("cannot write " + path + ": " + std::strerror(errno));
  auto fail = [&](const char* what) {
    const std::string err = std::strerror(errno);
    close(fd);
    unlink(tmp.data());
    throw std::runtime_error("cannot write " + path + " (" + what + "): " + err);
  };
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = write(fd, contents.data() + done, contents.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("write");
    }
    done += size_t(n);
  }
  if (fchmod(fd, 0644) != 0) fail("chmod");
  if (fsync(fd) != 0) fail("fsync");
  if (close(fd) != 0) {
    const std::string err = std::strerror(errno);
    unlink(tmp.data());
    throw std::runtime_error("cannot write " + path + " (close): " + err);
  }
  if (rename(tmp.data(), path.c_str()) != 0) {
    const std::string err = std::strerror(errno);
    unlink(tmp.data());
    throw std::runtime_error("cannot write " + path + " (rename): " + err);
  }
}

}  // namespace q4t
