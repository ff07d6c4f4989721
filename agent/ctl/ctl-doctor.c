/* SPDX-License-Identifier: MIT */
/* Owns `gpunodectl doctor`: one verdict per layer of a GPU node, bottom up, each with the fix in words —
 * PCI devices against probe.expect-gpus; IOMMU/vfio binding; kernel modules loaded and their version
 * against libnvidia-ml's; Secure Boot/lockdown against a module that is not loaded; device nodes with
 * their modes (MIG caps included); nvidia-persistenced and nvidia-fabricmanager (systemd over D-Bus) and
 * the GPUs' fabric registration; NVML itself; MIG state against the selected config; the CDI spec
 * (present, parses, names exactly what the cdi stage would write now); the container runtimes' CDI settings;
 * the NFD feature file; health. It reads the host itself (under the agent's configuration: the same
 * paths, so it works on a chroot or a simulated node), so it works without the daemon; what only the
 * daemon knows (MIG apply state, health) it asks over D-Bus when the daemon runs and says so when not.
 * NVML is read in a child process with a time limit: a wedged driver cannot hang the doctor. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cdi.h"
#include "config.h"
#include "ctl-doctor.h"
#include "ctl-output.h"
#include "fileio.h"
#include "gpu-nvml-internal.h"
#include "module.h"
#include "probe.h"
#include "strv.h"

typedef enum Verdict {
        VERDICT_OK,
        VERDICT_SKIPPED,
        VERDICT_WARNING,
        VERDICT_FAILED,
} Verdict;

static const char *const verdict_names[] = { "ok", "skipped", "warning", "failed" };

typedef struct Layer {
        const char *name;
        Verdict verdict;
        char *message;
        char *fix;
} Layer;

typedef struct DoctorGpu {
        char pci[32];
        char *uuid;
        int minor;
        bool mig;
        int fabric_state;        /* -1 not supported */
        unsigned fabric_status;
        char **mig_uuids;
} DoctorGpu;

typedef struct Doctor {
        const Config *c;
        Inventory *inv;
        const char *probe_error;
        char *kver;
        char *loaded_version;    /* /proc/driver/nvidia/version, NULL not loaded */
        char *installed_version; /* modinfo of the nvidia module for the running kernel, NULL none found */
        bool installed_signed;
        char *installed_error;   /* why none was found */
        bool nvml_ok;
        char *nvml_error;
        char *nvml_version;
        char **cdi_names;        /* the devices the cdi stage would write now, by its own rules */
        char **cdi_warnings;     /* what it says it left out or could not find, one line each */
        bool cdi_none;           /* it would write no spec: nothing to describe */
        char *cdi_error;         /* it could not work that out */
        DoctorGpu *gpus;
        size_t n_gpus;
        sd_bus *bus;             /* the system bus, NULL unreachable */
        bool agent_running;
        Layer layers[16];
        size_t n_layers;
} Doctor;

static void verdict(Doctor *d, const char *name, Verdict v, char *message, char *fix) {
        assert(d->n_layers < ELEMENTSOF(d->layers));
        d->layers[d->n_layers++] = (Layer) { .name = name, .verdict = v, .message = message, .fix = fix };
}

static char *under(const char *dir, const char *rel) {
        return path_join(dir, rel);
}

/* ---- NVML, in a child ------------------------------------------------------------------------------- */

/* The device names the cdi stage would write for this snapshot, worked out by the writer itself
 * (cdi_spec_build() with the agent's configuration): a GPU in MIG mode has no whole-GPU entry (as
 * nvidia-ctk from v1.18 on), cdi.device-name-strategy picks the names, and a device the writer cannot
 * describe is left out with a warning. The doctor judges the file against these, never by a rule of its
 * own. One line each; a reason is kept to one line. */
static void cdi_expected(FILE *f, const Config *c, const NvmlSnapshot *s) {
        _cleanup_(cdi_spec_freep) CdiSpec *spec = NULL;
        _cleanup_strv_free_ char **warnings = NULL;
        CdiBuildInput in = {
                .snapshot = s,
                .root = c->paths.root,
                .dev = c->paths.dev,
                .proc = c->paths.proc,
                .sys = c->paths.sys,
                .run = c->paths.run,
                .driver_root = c->cdi.driver_root,
                .device_names = c->cdi.device_names,
        };
        int r = cdi_spec_build(&in, &spec, &warnings);

        if (r == -ENODEV)
                fprintf(f, "cdi-none\n");
        else if (r < 0)
                fprintf(f, "cdi-error %s\n", strerror(-r));
        for (size_t i = 0; spec && i < spec->n_devices; i++)
                fprintf(f, "cdi %s\n", spec->devices[i].name);
        STRV_FOREACH(w, warnings) {
                for (char *q = *w; *q; q++)
                        if (*q == '\n')
                                *q = ' ';
                fprintf(f, "cdi-warning %s\n", *w);
        }
}

static void nvml_child(int fd, const Config *c) {
        const char *library = c->nvml.library;
        _cleanup_(gpu_nvml_closep) GpuNvml *n = NULL;
        _cleanup_(gpu_nvml_snapshot_freep) NvmlSnapshot *s = NULL;
        _cleanup_free_ char *error = NULL;
        FILE *f = fdopen(fd, "w");

        if (!f)
                _exit(1);
        if (gpu_nvml_open(library, &n, &error) < 0 || gpu_nvml_read(n, NULL, &s, &error) < 0) {
                fprintf(f, "error %s\n", strna(error));
                fclose(f);
                _exit(1);
        }
        fprintf(f, "version %s\n", strna(s->driver_version));
        for (size_t i = 0; i < s->n_gpus; i++) {
                const GpuInfo *g = &s->gpus[i];
                nvmlDevice_t h = NULL;
                nvmlGpuFabricInfo_t fi = {};
                char id[32];
                unsigned dom, bus, dev, fn;
                int state = -1;

                if (sscanf(g->pci_address, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) == 4) {
                        snprintf(id, sizeof id, "%08X:%02X:%02X.%X", dom, bus, dev, fn);
                        if (gpu_nvml_device_get_handle_by_pci_bus_id(n, id, &h) >= 0 &&
                            gpu_nvml_device_get_gpu_fabric_info(n, h, &fi) >= 0 &&
                            fi.state != NVML_GPU_FABRIC_STATE_NOT_SUPPORTED)
                                state = fi.state;
                }
                fprintf(f, "gpu %s %s %d %d %d %u\n", g->pci_address, g->uuid ?: "-", g->minor,
                        g->mig_current == GPU_MIG_ENABLED, state, (unsigned) fi.status);
                for (size_t j = 0; j < g->n_mig_devices; j++)
                        fprintf(f, "mig %s %s\n", g->pci_address, strna(g->mig_devices[j].uuid));
        }
        if (c->cdi.enabled)
                cdi_expected(f, c, s);
        fclose(f);
        _exit(0);
}

static void nvml_read(Doctor *d) {
        int p[2];
        char buf[1 << 16];
        size_t len = 0;

        if (pipe2(p, O_CLOEXEC) < 0) {
                d->nvml_error = strprintf("cannot create a pipe: %s", strerror(errno));
                return;
        }
        pid_t pid = fork();
        if (pid < 0) {
                d->nvml_error = strprintf("cannot fork: %s", strerror(errno));
                close(p[0]);
                close(p[1]);
                return;
        }
        if (pid == 0) {
                close(p[0]);
                nvml_child(p[1], d->c);
        }
        close(p[1]);
        uint64_t limit_ms = d->c->nvml.timeout_usec / USEC_PER_MSEC;
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        bool hung = false;
        for (;;) {
                struct timespec t;
                clock_gettime(CLOCK_MONOTONIC, &t);
                int64_t spent = (t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000;
                if (spent >= (int64_t) limit_ms) {
                        hung = true;
                        break;
                }
                struct pollfd pf = { .fd = p[0], .events = POLLIN };
                int r = poll(&pf, 1, (int) (limit_ms - spent));
                if (r < 0 && errno == EINTR)
                        continue;
                if (r <= 0) {
                        hung = r == 0;
                        break;
                }
                ssize_t k = read(p[0], buf + len, sizeof buf - 1 - len);
                if (k <= 0)
                        break;
                len += (size_t) k;
                if (len == sizeof buf - 1)
                        break;
        }
        close(p[0]);
        buf[len] = 0;
        if (hung)
                (void) kill(pid, SIGKILL);
        int status = 0;
        (void) waitpid(pid, &status, 0);
        if (hung) {
                d->nvml_error = strprintf("an NVML call did not return within nvml.timeout (%" PRIu64 " s): the "
                                          "driver is wedged or a GPU fell off the bus",
                                          d->c->nvml.timeout_usec / USEC_PER_SEC);
                return;
        }
        if (WIFSIGNALED(status)) {
                d->nvml_error = strprintf("libnvidia-ml crashed (signal %d)", WTERMSIG(status));
                return;
        }
        for (char *save = NULL, *l = strtok_r(buf, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
                if (startswith(l, "error ")) {
                        d->nvml_error = strdup(l + 6);
                } else if (startswith(l, "version ")) {
                        d->nvml_version = strdup(l + 8);
                        d->nvml_ok = true;
                } else if (startswith(l, "gpu ")) {
                        char pci[32], uuid[128];
                        int minor, mig, fs;
                        unsigned st;
                        if (sscanf(l, "gpu %31s %127s %d %d %d %u", pci, uuid, &minor, &mig, &fs, &st) != 6)
                                continue;
                        DoctorGpu *n = realloc(d->gpus, (d->n_gpus + 1) * sizeof *n);
                        if (!n)
                                break;
                        d->gpus = n;
                        n[d->n_gpus++] = (DoctorGpu) { .uuid = strdup(uuid), .minor = minor, .mig = mig,
                                                       .fabric_state = fs, .fabric_status = st };
                        snprintf(n[d->n_gpus - 1].pci, sizeof n->pci, "%s", pci);
                } else if (startswith(l, "cdi ")) {
                        (void) strv_extend(&d->cdi_names, l + 4);
                } else if (startswith(l, "cdi-warning ")) {
                        (void) strv_extend(&d->cdi_warnings, l + 12);
                } else if (streq(l, "cdi-none")) {
                        d->cdi_none = true;
                } else if (startswith(l, "cdi-error ")) {
                        free(d->cdi_error);
                        d->cdi_error = strdup(l + 10);
                } else if (startswith(l, "mig ") && d->n_gpus > 0) {
                        char pci[32], uuid[128];
                        if (sscanf(l, "mig %31s %127s", pci, uuid) == 2)
                                (void) strv_extend(&d->gpus[d->n_gpus - 1].mig_uuids, uuid);
                }
        }
        if (!d->nvml_ok && !d->nvml_error)
                d->nvml_error = strprintf("the NVML reader exited with status %d without an answer",
                                          WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

/* ---- Layers ------------------------------------------------------------------------------------------- */

static void check_pci(Doctor *d) {
        unsigned expect = d->c->probe.expect_gpus;
        size_t n = d->inv ? d->inv->n_gpus : 0;

        if (!d->inv)
                return verdict(d, "pci", VERDICT_FAILED, strprintf("cannot enumerate PCI devices under %s: %s",
                                                                   d->c->paths.sys, strna(d->probe_error)),
                               strdup("check paths.sys (the sysfs mount)"));
        if (expect > 0 && n < expect)
                return verdict(d, "pci", VERDICT_FAILED,
                               strprintf("%zu NVIDIA GPUs on the PCI bus, %u expected (probe.expect-gpus)", n, expect),
                               strdup("a GPU fell off the bus or is not seated: look for 'fallen off the bus' (XID 79) "
                                      "in the kernel log, reseat or replace it, or power-cycle the node"));
        if (n == 0)
                return verdict(d, "pci", VERDICT_WARNING, strdup("no NVIDIA GPU on the PCI bus"),
                               strdup("nothing to do on a node without GPUs; on a GPU node check the BIOS (above 4G "
                                      "decoding) and the PCIe slots"));
        verdict(d, "pci", VERDICT_OK, strprintf("%zu GPU%s%s, %zu NVSwitch%s", n, n == 1 ? "" : "s",
                                                expect ? " as expected" : "", d->inv->n_nvswitches,
                                                d->inv->n_nvswitches == 1 ? "" : "es"), NULL);
}

static void check_iommu(Doctor *d) {
        _cleanup_strv_free_ char **vfio = NULL, **none = NULL;

        for (size_t i = 0; d->inv && i < d->inv->n_gpus; i++) {
                const PciDevice *g = &d->inv->gpus[i];
                if (streq_ptr(g->driver, "vfio-pci"))
                        (void) strv_extend(&vfio, g->address);
                else if (!g->driver)
                        (void) strv_extend(&none, g->address);
        }
        if (!d->inv || d->inv->n_gpus == 0)
                return verdict(d, "iommu", VERDICT_SKIPPED, strdup("no GPU"), NULL);
        _cleanup_free_ char *v = strv_join(vfio, ", "), *u = strv_join(none, ", ");
        if (none && d->loaded_version)
                return verdict(d, "iommu", VERDICT_FAILED, strprintf("no driver bound to %s", u),
                               strprintf("the nvidia module is loaded but did not take it: see the kernel log (NVRM), "
                                         "or bind it: echo %s > /sys/bus/pci/drivers/nvidia/bind", none[0]));
        if (vfio)
                return verdict(d, "iommu", VERDICT_WARNING, strprintf("bound to vfio-pci (passthrough): %s", v),
                               strdup("these GPUs belong to VMs, not to this host; if that is not intended, unbind "
                                      "them from vfio-pci and remove their ids from vfio-pci.ids"));
        verdict(d, "iommu", VERDICT_OK, strdup(none ? "GPUs not bound yet (no driver loaded)" : "every GPU bound to nvidia"),
                NULL);
}

static void check_modules(Doctor *d) {
        if (!d->inv || d->inv->n_gpus == 0)
                return verdict(d, "modules", VERDICT_SKIPPED, strdup("no GPU"), NULL);
        if (!d->loaded_version)
                return verdict(d, "modules", VERDICT_FAILED,
                               strprintf("the nvidia kernel module is not loaded (no %s/driver/nvidia/version)",
                                         d->c->paths.proc),
                               strprintf("load it: modprobe nvidia (or systemctl restart gpu-node-agent); if modprobe "
                                         "says the module is missing, install the driver for kernel %s (its DKMS "
                                         "package or linux-modules-nvidia-*)", strna(d->kver)));
        if (d->nvml_version && !streq(d->nvml_version, d->loaded_version))
                return verdict(d, "modules", VERDICT_FAILED,
                               strprintf("version mismatch: kernel module %s, libnvidia-ml %s", d->loaded_version,
                                         d->nvml_version),
                               strdup("the driver was upgraded without a reload: stop its users and reload it "
                                      "(gpunodectl driver unload, then gpunodectl reconcile), or reboot"));
        if (d->installed_version && !streq(d->installed_version, d->loaded_version))
                return verdict(d, "modules", VERDICT_WARNING,
                               strprintf("kernel module %s loaded, but the installed module for %s is %s", d->loaded_version,
                                         strna(d->kver), d->installed_version),
                               strdup("the next boot (or reload) switches drivers: reload now to test it (gpunodectl "
                                      "driver unload, then gpunodectl reconcile) or reinstall the loaded version"));
        if (!d->installed_version)
                return verdict(d, "modules", VERDICT_WARNING,
                               strprintf("nvidia %s is loaded, but no nvidia module is installed for kernel %s: %s",
                                         d->loaded_version, strna(d->kver), strna(d->installed_error)),
                               strprintf("the next boot will have no driver: install it for %s (DKMS: dkms autoinstall "
                                         "-k %s)", strna(d->kver), strna(d->kver)));
        if (!isempty(d->c->driver.version) && !streq(d->c->driver.version, d->loaded_version))
                return verdict(d, "modules", VERDICT_WARNING,
                               strprintf("kernel module %s loaded, driver.version asks for %s", d->loaded_version,
                                         d->c->driver.version),
                               strdup("install that version, or change driver.version"));
        verdict(d, "modules", VERDICT_OK, strprintf("nvidia %s loaded and installed%s%s", d->loaded_version,
                                                   d->nvml_version ? ", libnvidia-ml " : "", d->nvml_version ?: ""),
                NULL);
}

static void check_secure_boot(Doctor *d) {
        _cleanup_free_ char *lock_path = under(d->c->paths.sys, "kernel/security/lockdown"), *lock = NULL;
        _cleanup_free_ char *sig_path = under(d->c->paths.sys, "module/module/parameters/sig_enforce"), *sig = NULL;
        bool enforcing = false;

        if (read_one_line_file(lock_path, &lock) >= 0 && lock && !strstr(lock, "[none]"))
                enforcing = true;
        if (read_one_line_file(sig_path, &sig) >= 0 && sig && (streq(sig, "Y") || streq(sig, "1")))
                enforcing = true;
        if (!enforcing)
                return verdict(d, "secure-boot", VERDICT_OK, strdup("module signatures not enforced"), NULL);
        if (d->installed_version && !d->installed_signed)
                return verdict(d, "secure-boot", d->loaded_version ? VERDICT_WARNING : VERDICT_FAILED,
                               strprintf("module signatures are enforced (lockdown %s) and the installed nvidia module "
                                         "is not signed", strna(lock)),
                               strdup("it will not load: have DKMS sign it (it does so with /var/lib/dkms/mok.key) "
                                      "and enroll the key: mokutil --import /var/lib/dkms/mok.pub, then reboot"));
        if (!d->loaded_version)
                return verdict(d, "secure-boot", VERDICT_FAILED,
                               strprintf("module signatures are enforced (lockdown %s) and nvidia is not loaded",
                                         strna(lock)),
                               strdup("sign the module with a key enrolled in the firmware: mokutil --import "
                                      "/var/lib/dkms/mok.pub, reboot and confirm in MOK manager, then rebuild with DKMS"));
        verdict(d, "secure-boot", VERDICT_OK, strdup("signatures enforced and nvidia loaded: its signature was accepted"),
                NULL);
}

static int check_char_dev(const char *dev, const char *name, char ***bad) {
        _cleanup_free_ char *p = path_join(dev, name);
        struct stat st;

        if (!p)
                return -ENOMEM;
        if (lstat(p, &st) < 0)
                return strv_extendf(bad, "%s missing", p);
        if (!S_ISCHR(st.st_mode))
                return strv_extendf(bad, "%s is not a character device", p);
        if ((st.st_mode & 0666) != 0666)
                return strv_extendf(bad, "%s has mode %03o, not 666", p, st.st_mode & 0777);
        return 0;
}

static void check_device_nodes(Doctor *d) {
        _cleanup_strv_free_ char **bad = NULL;
        size_t n = 0;

        if (!d->loaded_version)
                return verdict(d, "device-nodes", VERDICT_SKIPPED, strdup("the nvidia module is not loaded"), NULL);
        (void) check_char_dev(d->c->paths.dev, "nvidiactl", &bad);
        (void) check_char_dev(d->c->paths.dev, "nvidia-uvm", &bad);
        n += 2;
        for (size_t i = 0; i < d->n_gpus; i++) {
                char name[32];
                if (d->gpus[i].minor < 0)
                        continue;
                snprintf(name, sizeof name, "nvidia%d", d->gpus[i].minor);
                (void) check_char_dev(d->c->paths.dev, name, &bad);
                n++;
        }
        bool mig = false;
        for (size_t i = 0; i < d->n_gpus; i++)
                mig = mig || d->gpus[i].mig_uuids;
        if (mig) {
                _cleanup_free_ char *caps = path_join(d->c->paths.dev, "nvidia-caps");
                struct stat st;
                if (!caps || stat(caps, &st) < 0 || !S_ISDIR(st.st_mode))
                        (void) strv_extendf(&bad, "%s missing (MIG devices need their capability nodes)", strna(caps));
        }
        if (bad) {
                _cleanup_free_ char *t = strv_join(bad, "; ");
                return verdict(d, "device-nodes", VERDICT_FAILED, TAKE_PTR(t),
                               strdup("create them: nvidia-modprobe -c0 -u (or gpunodectl reconcile, whose devices "
                                      "stage makes them); check that no udev rule or tmpfiles.d entry removes them"));
        }
        verdict(d, "device-nodes", VERDICT_OK, strprintf("%zu nodes present, mode 666%s", n,
                                                        mig ? ", MIG capabilities present" : ""), NULL);
}

/* ActiveState of a unit, from systemd over the system bus: "active", "failed", … ; "not-found" when
 * systemd does not know it; NULL when systemd cannot be asked. */
static char *unit_state(Doctor *d, const char *unit) {
        _cleanup_(sd_bus_error_free) sd_bus_error e = SD_BUS_ERROR_NULL;
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        _cleanup_free_ char *load = NULL, *active = NULL;
        const char *path;

        if (!d->bus)
                return NULL;
        if (sd_bus_call_method(d->bus, "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
                               "org.freedesktop.systemd1.Manager", "LoadUnit", &e, &reply, "s", unit) < 0)
                return NULL;
        if (sd_bus_message_read(reply, "o", &path) < 0)
                return NULL;
        if (sd_bus_get_property_string(d->bus, "org.freedesktop.systemd1", path, "org.freedesktop.systemd1.Unit",
                                       "LoadState", &e, &load) < 0)
                return NULL;
        if (streq(load, "not-found"))
                return strdup("not-found");
        if (sd_bus_get_property_string(d->bus, "org.freedesktop.systemd1", path, "org.freedesktop.systemd1.Unit",
                                       "ActiveState", &e, &active) < 0)
                return NULL;
        return TAKE_PTR(active);
}

static void check_unit(Doctor *d, const char *layer, const char *unit, bool needed, bool required, const char *why) {
        _cleanup_free_ char *s = NULL;

        if (!needed)
                return verdict(d, layer, VERDICT_SKIPPED, strdup(why), NULL);
        s = unit_state(d, unit);
        if (!s)
                return verdict(d, layer, VERDICT_SKIPPED, strprintf("cannot ask systemd about %s (not on the system bus)", unit),
                               NULL);
        if (streq(s, "active"))
                return verdict(d, layer, VERDICT_OK, strprintf("%s is active", unit), NULL);
        if (streq(s, "not-found") && !required)
                return verdict(d, layer, VERDICT_SKIPPED, strprintf("%s is not installed (optional)", unit), NULL);
        if (streq(s, "not-found"))
                return verdict(d, layer, VERDICT_FAILED, strprintf("%s is not installed", unit),
                               strprintf("install the driver's %s package (same version as the driver)", unit));
        verdict(d, layer, VERDICT_FAILED, strprintf("%s is %s", unit, s),
                strprintf("start it and read why it stopped: systemctl start %s; journalctl -u %s", unit, unit));
}

static void check_fabric(Doctor *d) {
        bool nvswitch = d->inv && d->inv->n_nvswitches > 0;
        _cleanup_strv_free_ char **bad = NULL;

        check_unit(d, "fabricmanager", "nvidia-fabricmanager.service", nvswitch && d->c->fabric.fabricmanager, true,
                   nvswitch ? "fabric.fabricmanager is off" : "no NVSwitch: no fabric manager needed");
        for (size_t i = 0; i < d->n_gpus; i++)
                if (d->gpus[i].fabric_state >= 0 &&
                    (d->gpus[i].fabric_state != NVML_GPU_FABRIC_STATE_COMPLETED || d->gpus[i].fabric_status != 0))
                        (void) strv_extend(&bad, d->gpus[i].pci);
        if (bad) {
                _cleanup_free_ char *t = strv_join(bad, ", ");
                verdict(d, "fabric", VERDICT_FAILED, strprintf("fabric registration not complete on %s", t),
                        strdup("the GPUs are not ready for NVLink work (CUDA error 802): check nvidia-fabricmanager's "
                               "log, then reset the GPUs or reboot"));
        } else
                verdict(d, "fabric", d->n_gpus ? VERDICT_OK : VERDICT_SKIPPED,
                        strdup(d->n_gpus ? "every fabric-attached GPU registered (or none is fabric-attached)"
                                         : "NVML did not answer"), NULL);
}

static void check_nvml(Doctor *d) {
        if (!d->nvml_ok)
                return verdict(d, "nvml", VERDICT_FAILED, strprintf("NVML: %s", strna(d->nvml_error)),
                               strprintf("check nvml.library (%s), that the nvidia module is loaded, and the driver's "
                                         "user-space package matches it", d->c->nvml.library));
        size_t visible = d->n_gpus, pci = 0;
        for (size_t i = 0; d->inv && i < d->inv->n_gpus; i++)
                if (streq_ptr(d->inv->gpus[i].driver, "nvidia"))
                        pci++;
        if (visible < pci)
                return verdict(d, "nvml", VERDICT_FAILED,
                               strprintf("NVML lists %zu GPUs, %zu are bound to nvidia", visible, pci),
                               strdup("a GPU failed to initialise: see the kernel log (NVRM, XID) and nvidia-smi"));
        verdict(d, "nvml", VERDICT_OK, strprintf("driver %s, %zu GPU%s", strna(d->nvml_version), visible,
                                                visible == 1 ? "" : "s"), NULL);
}

static char *agent_property(Doctor *d, const char *name) {
        char *v = NULL;
        if (!d->agent_running ||
            sd_bus_get_property_string(d->bus, "org.gpunodeagent.Agent1", "/org/gpunodeagent/Agent1",
                                       "org.gpunodeagent.Agent1.Manager", name, NULL, &v) < 0)
                return NULL;
        return v;
}

static void check_mig(Doctor *d) {
        _cleanup_free_ char *config = NULL, *state = NULL;

        if (!d->agent_running)
                return verdict(d, "mig", VERDICT_SKIPPED,
                               strdup("the agent is not running (gpunodectl mig assert compares with it running)"), NULL);
        config = agent_property(d, "MigConfig");
        state = agent_property(d, "MigConfigState");
        if (isempty(config))
                return verdict(d, "mig", VERDICT_SKIPPED, strdup("MIG is not managed (no mig.selected)"), NULL);
        if (streq_ptr(state, "success"))
                return verdict(d, "mig", VERDICT_OK, strprintf("%s applied", config), NULL);
        if (streq_ptr(state, "pending") || streq_ptr(state, "rebooting"))
                return verdict(d, "mig", VERDICT_WARNING, strprintf("%s: %s", config, state),
                               strdup(streq_ptr(state, "rebooting") ? "reset the GPUs or reboot to finish the change"
                                                                    : "an apply is running: wait for it"));
        verdict(d, "mig", VERDICT_FAILED, strprintf("%s: %s", config, strna(state)),
                strdup("gpunodectl status shows why; gpunodectl mig apply retries"));
}

static void check_cdi(Doctor *d) {
        _cleanup_(cdi_spec_freep) CdiSpec *spec = NULL;
        _cleanup_free_ char *text = NULL, *error = NULL;
        _cleanup_strv_free_ char **missing = NULL, **extra = NULL;
        size_t size = 0;
        int r;

        if (!d->c->cdi.enabled)
                return verdict(d, "cdi", VERDICT_SKIPPED, strdup("cdi.enabled is false"), NULL);
        r = read_full_file(d->c->cdi.spec, 1 << 24, &text, &size);
        if (r == -ENOENT && d->nvml_ok && d->cdi_none)
                return verdict(d, "cdi", VERDICT_SKIPPED,
                               strprintf("no GPU or MIG device to describe, so no CDI spec at %s (as the cdi stage "
                                         "leaves it)", d->c->cdi.spec), NULL);
        if (r == -ENOENT)
                return verdict(d, "cdi", VERDICT_FAILED, strprintf("no CDI spec at %s", d->c->cdi.spec),
                               strdup("gpunodectl reconcile writes it (the cdi stage); containers asking for "
                                      "nvidia.com/gpu=… fail until then"));
        if (r < 0)
                return verdict(d, "cdi", VERDICT_FAILED, strprintf("cannot read %s: %s", d->c->cdi.spec, strerror(-r)),
                               NULL);
        r = cdi_spec_parse(d->c->cdi.spec, text, size, &spec, &error);
        if (r == -ENOMEM)
                return verdict(d, "cdi", VERDICT_FAILED, strdup("out of memory"), NULL);
        if (r < 0)
                return verdict(d, "cdi", VERDICT_FAILED, strprintf("container runtimes refuse it: %s", strna(error)),
                               strdup("remove it and run gpunodectl reconcile"));
        if (!streq_ptr(spec->kind, CDI_KIND))
                return verdict(d, "cdi", VERDICT_FAILED, strprintf("%s is not a CDI spec of kind nvidia.com/gpu", d->c->cdi.spec),
                               strdup("remove it and run gpunodectl reconcile"));
        if (!d->nvml_ok)
                return verdict(d, "cdi", VERDICT_WARNING, strprintf("%s present; not compared (NVML did not answer)",
                                                                   d->c->cdi.spec), NULL);
        if (d->cdi_error)
                return verdict(d, "cdi", VERDICT_WARNING, strprintf("%s present; not compared (cannot work out what the "
                                                                   "cdi stage would write: %s)", d->c->cdi.spec,
                                                                   d->cdi_error), NULL);

        /* The file against what the writer would write now: a device it would write and the file lacks
         * is missing; one the file names and the writer would not is stale (a GPU or MIG device that is
         * gone, or a GPU that went into MIG mode). Both are what `gpunodectl reconcile` rewrites. */
        for (size_t i = 0; i < spec->n_devices; i++)
                if (!strv_contains(d->cdi_names, spec->devices[i].name))
                        (void) strv_extend(&extra, spec->devices[i].name);
        STRV_FOREACH(n, d->cdi_names) {
                bool found = false;
                for (size_t i = 0; i < spec->n_devices && !found; i++)
                        found = streq(spec->devices[i].name, *n);
                if (!found)
                        (void) strv_extend(&missing, *n);
        }
        if (missing || extra) {
                _cleanup_free_ char *m = strv_join(missing, ", "), *x = strv_join(extra, ", ");
                return verdict(d, "cdi", VERDICT_FAILED,
                               strprintf("%s is stale: %s%s%s%s%s", d->c->cdi.spec, missing ? "missing " : "", m ?: "",
                                         missing && extra ? "; " : "", extra ? "lists devices the node does not have: " : "",
                                         x ?: ""),
                               strdup("regenerate it: gpunodectl reconcile (the cdi stage rewrites it when the GPUs or "
                                      "MIG devices change)"));
        }

        bool mig = false;
        for (size_t i = 0; i < d->n_gpus; i++)
                mig = mig || d->gpus[i].mig;
        const char *how = mig ? " (a GPU in MIG mode by its MIG devices only, as nvidia-ctk 1.18 and later)" : "";
        if (d->cdi_warnings) {
                _cleanup_free_ char *t = strv_join(d->cdi_warnings, "; ");
                return verdict(d, "cdi", VERDICT_WARNING,
                               strprintf("%s lists every device the agent can describe%s; the cdi stage warns: %s",
                                         d->c->cdi.spec, how, strna(t)),
                               strdup("each warning says what is missing on the node; gpunodectl reconcile does not "
                                      "change them"));
        }
        verdict(d, "cdi", VERDICT_OK, strprintf("%s lists every GPU and MIG device%s", d->c->cdi.spec, how), NULL);
}

static void check_runtime(Doctor *d) {
        _cleanup_free_ char *containerd = under(d->c->paths.etc, "containerd/config.toml"), *ct = NULL;
        _cleanup_free_ char *crio = under(d->c->paths.etc, "crio/crio.conf"), *cr = NULL;
        _cleanup_free_ char *docker = under(d->c->paths.etc, "docker/daemon.json"), *dk = NULL;
        _cleanup_strv_free_ char **ok = NULL, **bad = NULL;

        if (read_full_file(containerd, 1 << 20, &ct, NULL) >= 0) {
                /* containerd 1.7 needs enable_cdi = true in the CRI plugin; 2.0 enables it by default. */
                if (strstr(ct, "enable_cdi = true") || strstr(ct, "enable_cdi=true") ||
                    (strstr(ct, "version = 3") && !strstr(ct, "enable_cdi = false")))
                        (void) strv_extend(&ok, "containerd");
                else
                        (void) strv_extendf(&bad, "%s: enable_cdi is not true (set enable_cdi = true and "
                                                  "cdi_spec_dirs = [\"/etc/cdi\", \"/var/run/cdi\"] in "
                                                  "[plugins.\"io.containerd.grpc.v1.cri\"], then restart containerd)",
                                            containerd);
        }
        if (read_full_file(crio, 1 << 20, &cr, NULL) >= 0) {
                /* CRI-O reads CDI by default from /etc/cdi and /var/run/cdi; a cdi_spec_dirs list replaces them. */
                if (strstr(cr, "cdi_spec_dirs") && !strstr(cr, "/var/run/cdi") && !strstr(cr, "/run/cdi"))
                        (void) strv_extendf(&bad, "%s: cdi_spec_dirs leaves out /var/run/cdi (add it)", crio);
                else
                        (void) strv_extend(&ok, "CRI-O");
        }
        if (read_full_file(docker, 1 << 20, &dk, NULL) >= 0) {
                if (strstr(dk, "\"cdi\": true") || strstr(dk, "\"cdi\":true") || strstr(dk, "cdi-spec-dirs"))
                        (void) strv_extend(&ok, "Docker");
                else
                        (void) strv_extendf(&bad, "%s: CDI is off (add \"features\": {\"cdi\": true} and restart "
                                                  "docker)", docker);
        }
        _cleanup_free_ char *o = strv_join(ok, ", ");
        if (bad) {
                _cleanup_free_ char *t = strv_join(bad, "; ");
                return verdict(d, "runtime", VERDICT_FAILED, strprintf("a container runtime without CDI: %s", t),
                               strdup("containers cannot get GPUs by CDI name (nvidia.com/gpu=…) until it reads the spec"));
        }
        if (!ok)
                return verdict(d, "runtime", VERDICT_SKIPPED,
                               strprintf("no containerd, CRI-O or Docker configuration under %s", d->c->paths.etc), NULL);
        verdict(d, "runtime", VERDICT_OK, strprintf("%s read%s CDI specs", o, strv_length(ok) == 1 ? "s" : ""), NULL);
}

static void check_nfd(Doctor *d) {
        const ConfigLabels *l = &d->c->labels;
        _cleanup_free_ char *path = NULL, *text = NULL;
        struct stat st;

        if (!l->enabled)
                return verdict(d, "nfd", VERDICT_SKIPPED, strdup("labels.enabled is false"), NULL);
        if (stat(l->directory, &st) < 0 || !S_ISDIR(st.st_mode))
                return verdict(d, "nfd", VERDICT_FAILED,
                               strprintf("NFD's directory %s does not exist: Node Feature Discovery is not installed "
                                         "(or looks elsewhere)", l->directory),
                               strdup("install node-feature-discovery (its worker reads features.d), or set "
                                      "labels.directory to where it reads"));
        path = path_join(l->directory, l->file);
        if (!path || read_full_file(path, 1 << 20, &text, NULL) < 0)
                return verdict(d, "nfd", VERDICT_FAILED, strprintf("no feature file %s", strna(path)),
                               strdup("gpunodectl reconcile writes it (the labels stage)"));
        const char *e = strstr(text, "# +expiry-time=");
        if (e) {
                struct tm tm = {};
                if (strptime(e + 15, "%Y-%m-%dT%H:%M:%SZ", &tm) && timegm(&tm) < time(NULL))
                        return verdict(d, "nfd", VERDICT_FAILED, strprintf("%s expired (NFD has dropped its labels)", path),
                                       strdup("the agent refreshes it while it runs: start gpu-node-agent"));
        }
        verdict(d, "nfd", VERDICT_OK, strprintf("%s published%s", path, e ? ", not expired" : ""), NULL);
}

static void check_health(Doctor *d) {
        _cleanup_free_ char *h = NULL;

        if (!d->agent_running)
                return verdict(d, "health", VERDICT_SKIPPED,
                               strdup("the agent is not running: no one watches the GPUs' XID/ECC events"), NULL);
        h = agent_property(d, "Health");
        if (!h)
                return verdict(d, "health", VERDICT_SKIPPED, strdup("the agent did not answer"), NULL);
        if (streq(h, "ok"))
                return verdict(d, "health", VERDICT_OK, strdup("every GPU ok"), NULL);
        verdict(d, "health", startswith(h, "failed") ? VERDICT_FAILED : VERDICT_WARNING, strdup(h),
                strdup("gpunodectl gpus and busctl introspect … /gpu/N show each GPU's Health and HealthEvents; after "
                       "resetting a failed GPU call ResetGpuHealth"));
}

/* ---- Configuration ------------------------------------------------------------------------------------ */

/* What the daemon runs on: a reload it rejected or a remote document it refused (a key that may not
 * come from the network, a bad signature, a rollback) leaves it on the configuration before, which the
 * local files read above do not show. */
static void check_config(Doctor *d) {
        _cleanup_free_ char *error = NULL;

        if (!d->agent_running)
                return verdict(d, "config", VERDICT_SKIPPED,
                               strdup("the agent is not running (the local files load; only the agent fetches a "
                                      "remote configuration)"), NULL);
        error = agent_property(d, "ConfigError");
        if (!error)
                return verdict(d, "config", VERDICT_SKIPPED, strdup("the agent did not answer"), NULL);
        if (isempty(error))
                return verdict(d, "config", VERDICT_OK, strdup("the agent took its last configuration"), NULL);
        verdict(d, "config", VERDICT_WARNING, TAKE_PTR(error),
                strdup("the agent keeps its previous configuration (for a remote document, the last known good "
                       "copy): fix what the message names (a key the remote document may not set belongs in a "
                       "local file under /etc/gpu-node-agent/conf.d/), then gpunodectl reload or wait for the next "
                       "fetch"));
}

/* ---- Output --------------------------------------------------------------------------------------------- */

static int print_text(const Doctor *d, bool legend) {
        _cleanup_(ctl_table_freep) CtlTable *t = NULL;
        int r;

        r = ctl_table_new(&t, 3, (const char *const[]) { "LAYER", "VERDICT", "DETAIL" });
        if (r < 0)
                return r;
        for (size_t i = 0; i < d->n_layers; i++) {
                const Layer *l = &d->layers[i];
                r = ctl_table_add_row(t, (const char *const[]) { l->name, verdict_names[l->verdict], strna(l->message) });
                if (r < 0)
                        return r;
                ctl_table_set_color(t, 1, l->verdict == VERDICT_OK ? ANSI_GREEN :
                                          l->verdict == VERDICT_FAILED ? ANSI_RED :
                                          l->verdict == VERDICT_WARNING ? ANSI_YELLOW : NULL);
        }
        ctl_table_print(t, stdout, legend);
        for (size_t i = 0; i < d->n_layers; i++)
                if (d->layers[i].fix && d->layers[i].verdict >= VERDICT_WARNING)
                        printf("%s%s%s: %s\n", ctl_ansi(ANSI_BOLD), d->layers[i].name, ctl_ansi(ANSI_NORMAL),
                               d->layers[i].fix);
        if (!d->agent_running)
                printf("The agent is not running: checked what the doctor reads itself; mig and health need the agent.\n");
        return 0;
}

static void print_json(const Doctor *d, int exit_code) {
        bool first = true;

        fputc('{', stdout);
        ctl_json_kv_bool(stdout, &first, "agent_running", d->agent_running);
        ctl_json_kv_int(stdout, &first, "exit", exit_code);
        ctl_json_key(stdout, &first, "layers");
        fputc('[', stdout);
        for (size_t i = 0; i < d->n_layers; i++) {
                bool f2 = true;
                if (i)
                        fputc(',', stdout);
                fputc('{', stdout);
                ctl_json_kv_string(stdout, &f2, "name", d->layers[i].name);
                ctl_json_kv_string(stdout, &f2, "verdict", verdict_names[d->layers[i].verdict]);
                ctl_json_kv_string_or_null(stdout, &f2, "message", d->layers[i].message);
                ctl_json_kv_string_or_null(stdout, &f2, "fix", d->layers[i].fix);
                fputc('}', stdout);
        }
        fputs("]}\n", stdout);
}

static void doctor_done(Doctor *d) {
        inventory_free(d->inv);
        free(d->kver);
        free(d->loaded_version);
        free(d->installed_version);
        free(d->installed_error);
        free(d->nvml_error);
        free(d->nvml_version);
        strv_free(d->cdi_names);
        strv_free(d->cdi_warnings);
        free(d->cdi_error);
        for (size_t i = 0; i < d->n_gpus; i++) {
                free(d->gpus[i].uuid);
                strv_free(d->gpus[i].mig_uuids);
        }
        free(d->gpus);
        for (size_t i = 0; i < d->n_layers; i++) {
                free(d->layers[i].message);
                free(d->layers[i].fix);
        }
}

static void read_installed(Doctor *d) {
        _cleanup_(module_context_freep) ModuleContext *ctx = NULL;
        _cleanup_(module_info_freep) ModuleInfo *info = NULL;
        _cleanup_free_ char *dir = d->kver ? path_join(d->c->paths.modules, d->kver) : NULL;
        const char *const none[] = { NULL };
        int r;

        if (!dir) {
                d->installed_error = strdup("the kernel release is unknown");
                return;
        }
        const ModuleContextConfig cc = { .modules_dir = dir, .config_paths = none, .sys_dir = d->c->paths.sys,
                                         .kernel_release = d->kver };
        r = module_context_new(&cc, &ctx);
        if (r < 0) {
                d->installed_error = strprintf("cannot read %s: %s", dir, strerror(-r));
                return;
        }
        r = module_lookup(ctx, "nvidia", &info, &d->installed_error);
        if (r < 0) {
                if (!d->installed_error)
                        d->installed_error = strprintf("no nvidia module under %s", dir);
                return;
        }
        d->installed_version = strdup(info->version ?: "unknown");
        d->installed_signed = info->signer != NULL;
}

static char *read_loaded_version(const char *proc) {
        _cleanup_free_ char *p = path_join(proc, "driver/nvidia/version"), *text = NULL;
        char v[64];

        if (!p || read_full_file(p, 1 << 16, &text, NULL) < 0)
                return NULL;
        const char *k = strstr(text, "Kernel Module");
        if (!k || sscanf(k + strlen("Kernel Module"), " %63s", v) != 1)
                return strdup("unknown");
        return strdup(v);
}

static void config_freep(Config **c) {
        config_free(*c);
}

int ctl_doctor(const CtlDoctorOptions *o) {
        _cleanup_(config_freep) Config *c = NULL;
        char *dirs[] = { (char *) o->config_dir, NULL };
        _cleanup_free_ char *error = NULL;
        Doctor d = {};
        int r;

        ConfigLoadOptions lo = { .root = o->root, .main_file = o->config_file,
                                 .dropin_dirs = o->config_dir ? dirs : NULL };
        r = config_load(&lo, &c, &error);
        if (r < 0) {
                fprintf(stderr, "gpunodectl: Cannot load the agent's configuration: %s\n", strna(error));
                return CTL_DOCTOR_FAILURES;
        }
        d.c = c;
        d.bus = o->bus;
        if (d.bus) {
                r = sd_bus_get_name_creds(d.bus, "org.gpunodeagent.Agent1", 0, NULL);
                d.agent_running = r >= 0;
        }
        _cleanup_free_ char *osrel = path_join(c->paths.proc, "sys/kernel/osrelease");
        if (osrel)
                (void) read_one_line_file(osrel, &d.kver);
        _cleanup_free_ char *probe_error = NULL;
        (void) probe_pci(c->paths.sys, c->paths.pci_ids, &d.inv, &probe_error);
        d.probe_error = probe_error;
        d.loaded_version = read_loaded_version(c->paths.proc);
        read_installed(&d);
        if (d.inv && d.inv->n_gpus > 0)
                nvml_read(&d);

        check_pci(&d);
        check_iommu(&d);
        check_modules(&d);
        check_secure_boot(&d);
        check_device_nodes(&d);
        check_unit(&d, "persistenced", "nvidia-persistenced.service", c->fabric.persistenced && d.inv && d.inv->n_gpus, false,
                   "fabric.persistenced is off, or no GPU");
        check_fabric(&d);
        check_nvml(&d);
        check_mig(&d);
        check_cdi(&d);
        check_runtime(&d);
        check_nfd(&d);
        check_health(&d);
        check_config(&d);

        int exit_code = CTL_DOCTOR_OK;
        for (size_t i = 0; i < d.n_layers; i++)
                if (d.layers[i].verdict == VERDICT_FAILED)
                        exit_code = CTL_DOCTOR_FAILURES;
                else if (d.layers[i].verdict == VERDICT_WARNING && exit_code == CTL_DOCTOR_OK)
                        exit_code = CTL_DOCTOR_WARNINGS;
        if (o->json)
                print_json(&d, exit_code);
        else
                (void) print_text(&d, o->legend);
        doctor_done(&d);
        return exit_code;
}
