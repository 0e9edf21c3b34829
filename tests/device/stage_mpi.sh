#!/usr/bin/env bash
# Stage Open MPI (Debian's 4.1.4) for the device machine, which has none: run here, from anywhere in the repository,
#   tests/device/stage_mpi.sh
# It fills .dev/mpi/ with the .deb files of the runtime closure of openmpi-bin and libopenmpi3 and a .dev/mpi/env.sh;
# carry [".dev"] and begin the command with `source .dev/env.sh; source .dev/mpi/env.sh` (after
# ../shared/device/prepare.sh). env.sh unpacks the packages into / (keeping usr-merge's links such as /lib -> usr/lib,
# which dpkg -x would replace with directories), makes the links their install scripts would make
# (mpirun, mpiexec, libpsm_infinipath.so.1), and sets Open MPI up for one host in a container: as root, shared memory
# only (btl self,vader; no InfiniBand, UCX or libfabric), single-copy (CMA) only where a probe finds it allowed, no
# binding of ranks to cores.
# The closure is `apt-cache depends --recurse --no-recommends --no-suggests openmpi-bin libopenmpi3` less what every
# base system has (libc6, libgcc-s1, libstdc++6, zlib1g and the like), less openssh-client (only for other hosts)
# and libhwloc-plugins (optional hwloc plugins that pull in X11, libxml2 and OpenCL). libatomic1, libudev1 and
# libuuid1 go to .dev/mpi/base/ and are unpacked only where the system lacks their library.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
grep -qx '/.dev/' .git/info/exclude 2>/dev/null || echo '/.dev/' >> .git/info/exclude
pkgs=(openmpi-bin openmpi-common libopenmpi3 libpmix2 libmunge2 libhwloc15 libevent-core-2.1-7
      libevent-pthreads-2.1-7 libfabric1 libucx0 libibverbs1 ibverbs-providers librdmacm1 libnl-3-200
      libnl-route-3-200 libpsm2-2 libpsm-infinipath1 libnuma1)
base=(libatomic1:libatomic.so.1 libudev1:libudev.so.1 libuuid1:libuuid.so.1)

rm -rf .dev/mpi
mkdir -p .dev/mpi/base
# The apt cache's .deb of the candidate version, else one downloaded.
fetch() {  # package dir
  local ver deb
  ver=$(apt-cache policy "$1" | sed -n 's/^ *Candidate: *//p')
  deb=$(ls /var/cache/apt/archives/"$1"_"${ver/:/%3a}"_{amd64,all}.deb 2>/dev/null | head -1 || true)
  if [ -n "$deb" ]; then cp "$deb" "$2/"; else (cd "$2" && apt-get download -q "$1=$ver" 2>/dev/null); fi
  ls "$2/$1"_*.deb > /dev/null
}
for p in "${pkgs[@]}"; do fetch "$p" .dev/mpi; done
for pl in "${base[@]}"; do fetch "${pl%%:*}" .dev/mpi/base; done

{
  echo '# Made by tests/device/stage_mpi.sh: Open MPI for one host; source after .dev/env.sh.'
  # Not dpkg -x: it would replace the links /lib -> usr/lib and the like with directories (libnl-3-200 has ./lib/).
  echo '_unpack() { dpkg-deb --fsys-tarfile "$1" | tar -x --keep-directory-symlink --no-overwrite-dir -C /; }'
  echo 'for f in .dev/mpi/*.deb; do _unpack "$f"; done'
  echo '_libs=$(ldconfig -p)'
  for pl in "${base[@]}"; do
    echo "[[ \$_libs == *\$'\\t'${pl#*:}' '* ]] || _unpack .dev/mpi/base/${pl%%:*}_*.deb"
  done
  cat <<'ENV'
[ -e /usr/bin/mpirun ] || ln -s mpirun.openmpi /usr/bin/mpirun
[ -e /usr/bin/mpiexec ] || ln -s mpiexec.openmpi /usr/bin/mpiexec
[ -e /usr/lib/x86_64-linux-gnu/libpsm_infinipath.so.1 ] ||
  ln -s /usr/lib/libpsm1/libpsm_infinipath.so.1.16 /usr/lib/x86_64-linux-gnu/libpsm_infinipath.so.1
unset -v _libs; unset -f _unpack; ldconfig
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Ranks talk through shared memory only.
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_mtl=^ofi,psm,psm2 OMPI_MCA_osc=^ucx,pt2pt
# Single-copy transfers (CMA: process_vm_readv) where the container lets a process read another's memory, else
# copies through shared memory. The probe reads a forked child's memory as vader would.
python3 - <<'PY' 2>/dev/null || export OMPI_MCA_btl_vader_single_copy_mechanism=none
import ctypes as c, os
libc = c.CDLL(None, use_errno=True)
class V(c.Structure): _fields_ = [("b", c.c_void_p), ("n", c.c_size_t)]
src, dst = c.create_string_buffer(8), c.create_string_buffer(8)
rr, rw = os.pipe(); hr, hw = os.pipe(); pid = os.fork()
if pid == 0:
    src.value = b"child"; libc.prctl(0x59616D61, c.c_ulong(2**64 - 1), 0, 0, 0); os.write(rw, b"x"); os.read(hr, 1); os._exit(0)
os.read(rr, 1)
n = libc.process_vm_readv(pid, c.byref(V(c.addressof(dst), 8)), 1, c.byref(V(c.addressof(src), 8)), 1, 0)
os.write(hw, b"x"); os.waitpid(pid, 0)
raise SystemExit(n != 8 or dst.value != b"child")
PY
# Ranks free to use every core (each runs threads of its own); all on this host, so no ssh (the agent is never run).
export OMPI_MCA_hwloc_base_binding_policy=none OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_plm_rsh_agent=false
# A machine with a PMIx of its own (Ubuntu 24.04's 5.0) ends up with two: mpirun then crashed in PMIx's ppn
# generation (pmix_preg_base_generate_ppn) until its native component was named.
export PMIX_MCA_preg=native
ENV
} > .dev/mpi/env.sh
du -sh .dev/mpi; du -sh .dev
echo "staged .dev/mpi/ — carry [\".dev\"] and begin the command with: source .dev/env.sh; source .dev/mpi/env.sh"
