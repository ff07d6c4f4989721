# SPDX-License-Identifier: MIT
# Sourced by scripts/demo and scripts/test: installs the Debian packages the build and the tests need,
# only those that are missing (so a prepared machine pays nothing). This is the one place that
# installs anything: the test suites themselves never install packages or touch /etc/apt.

# Building the agent, its test fixtures (cmocka is needed to configure them) and running it on a
# simulated node (./scripts/demo).
GNA_BUILD_PACKAGES=(
        gcc libc6-dev meson ninja-build pkg-config kmod libcmocka-dev
        libsystemd-dev libkmod-dev libpci-dev libyaml-dev libcurl4-openssl-dev libjson-c-dev
        dbus python3 python3-yaml pciutils
)

# Everything ./scripts/test runs, by the suite that needs it:
#   unit/integration: python3-dbus (D-Bus clients), python3-jsonschema (CDI schema test),
#                     procps (/bin/kill, pgrep), util-linux (setpriv, nsenter)
#   valgrind:         valgrind
#   e2e:              systemd, systemd-container (systemd-nspawn), procps
#   vm:               qemu-system-x86, busybox-static, cpio, file, dkms, linux-headers-amd64 (the real
#                     kernel's headers; its image is downloaded and unpacked, never installed)
#   nvml-abi:         apt + dpkg-deb (Debian's nvml.h is downloaded through a private apt config)
#   packaging:        rpm (rpmbuild for the RPM spec), fakeroot
#   remote config:    openssl (certificates for the loopback TLS servers of the remote-config and
#                     Kubernetes watch tests)
#   fuzz:             clang-14, libclang-rt-14-dev (libFuzzer and the sanitizer runtimes; clang-14
#                     only recommends the latter)
#   consumers:        slurmd (the real slurmd parses the gres.conf we write: slurmd -G)
#   docs:             man-db
#   unit (hwdb):      udev (systemd-hwdb compiles the fixture hwdb of test-pci-names)
#   hotplug:          umockdev, gir1.2-umockdev-1.0, python3-gi (uevents into sd_device_monitor:
#                     integration-hotplug runs under umockdev-wrapper)
#   metrics:          prometheus-node-exporter (the real textfile collector scrapes the file we write)
#   driver:           strace (delays the agent's writes so that a crashing worker's EPIPE is hit every time)
GNA_TEST_PACKAGES=(
        python3-dbus python3-jsonschema procps util-linux valgrind
        systemd systemd-container
        qemu-system-x86 busybox-static cpio file dkms linux-headers-amd64
        rpm fakeroot man-db slurmd openssl udev prometheus-node-exporter strace
        umockdev gir1.2-umockdev-1.0 python3-gi
        clang-14 libclang-rt-14-dev
)

# gna_install_deps [build|test] [EXTRA...]: installs what is missing of that set (default: test,
# which includes build).
gna_install_deps() {
        local set=${1:-test} missing=() p
        [ $# -gt 0 ] && shift
        local want=("${GNA_BUILD_PACKAGES[@]}")
        [ "$set" = test ] && want+=("${GNA_TEST_PACKAGES[@]}")
        for p in "${want[@]}" "$@"; do
                dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
        done
        [ ${#missing[@]} -eq 0 ] && return 0
        if [ "$(id -u)" -ne 0 ]; then
                echo "Missing Debian packages: ${missing[*]} — run this script as root, or install them." >&2
                return 1
        fi
        echo "Installing: ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get -o DPkg::Lock::Timeout=600 update -q >/dev/null || return 1
        apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${missing[@]}" >/dev/null || return 1
}
