/* SPDX-License-Identifier: MIT */
/* Owns our checker of the CDI loader's content rules 1–11 of the CDI specification (container-device-interface SPEC.md) (versions, names, annotation
 * keys, devices, edits, hooks, mounts). The CDI JSON schema is much weaker than the loader, so this, not
 * the schema, is what stands between us and a spec that every runtime on the node would silently drop.
 * Parsing (and rule 12, unknown fields) is in cdi-parse.c. */
#include <ctype.h>
#include <inttypes.h>
#include <stdarg.h>

#include "cdi.h"
#include "strv.h"

static int cerr(char **error, const char *fmt, ...) _printf_(2, 3);
static int cerr(char **error, const char *fmt, ...) {
        va_list ap;

        free(*error);
        va_start(ap, fmt);
        if (vasprintf(error, fmt, ap) < 0)
                *error = NULL;
        va_end(ap);
        return -EINVAL;
}

static bool is_letter(char c) {
        return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z');
}

static bool is_alnum(char c) {
        return is_letter(c) || (c >= '0' && c <= '9');
}

/* Rule 2 for vendor and class; NULL when valid, else why not. */
static const char *vendor_class_problem(const char *s) {
        size_t n = strlen(s);

        if (n == 0)
                return "is empty";
        if (!is_letter(s[0]))
                return "must start with a letter";
        for (size_t i = 1; i + 1 < n; i++)
                if (!is_alnum(s[i]) && !strchr("_.-", s[i]))
                        return "may contain only letters, digits, '_', '.' and '-'";
        if (!is_alnum(s[n - 1]))
                return "must end with a letter or a digit";
        return NULL;
}

static const char *device_name_problem(const char *s) {
        size_t n = strlen(s);

        if (n == 0)
                return "is empty";
        if (!is_alnum(s[0]))
                return "must start with a letter or a digit";
        for (size_t i = 1; i + 1 < n; i++)
                if (!is_alnum(s[i]) && !strchr("_.:-", s[i]))
                        return "may contain only letters, digits, '_', '.', ':' and '-'";
        if (!is_alnum(s[n - 1]))
                return "must end with a letter or a digit";
        return NULL;
}

/* Kubernetes' IsQualifiedName on the lower-cased key, as the loader checks annotation keys. */
static bool dns_subdomain_ok(const char *s, size_t n) {
        if (n == 0 || n > 253)
                return false;
        for (size_t i = 0, label = 0; i <= n; i++) {
                if (i == n || s[i] == '.') {
                        if (i == label || s[i - 1] == '-' || s[label] == '-')
                                return false;
                        label = i + 1;
                        continue;
                }
                if (!(isdigit((unsigned char) s[i]) || islower((unsigned char) s[i]) || s[i] == '-'))
                        return false;
        }
        return true;
}

static bool annotation_key_ok(const char *key) {
        _cleanup_free_ char *k = strdup(key);
        const char *name;

        if (!k)
                return false;
        for (char *p = k; *p; p++)
                *p = (char) tolower((unsigned char) *p);
        char *slash = strchr(k, '/');
        if (slash) {
                if (strchr(slash + 1, '/') || !dns_subdomain_ok(k, (size_t) (slash - k)))
                        return false;
                name = slash + 1;
        } else
                name = k;
        size_t n = strlen(name);
        if (n == 0 || n > 63 || !is_alnum(name[0]) || !is_alnum(name[n - 1]))
                return false;
        for (size_t i = 0; i < n; i++)
                if (!is_alnum(name[i]) && !strchr("-_.", name[i]))
                        return false;
        return true;
}

static int check_annotations(char *const *pairs, const char *where, char **error) {
        size_t total = 0;

        for (size_t i = 0; pairs && pairs[i] && pairs[i + 1]; i += 2) {
                if (!annotation_key_ok(pairs[i]))
                        return cerr(error,
                                    "%s: annotation key \"%s\" is not a valid Kubernetes annotation key ([prefix/]name, "
                                    "name up to 63 letters, digits, '-', '_', '.', starting and ending alphanumeric)",
                                    where, pairs[i]);
                total += strlen(pairs[i]) + strlen(pairs[i + 1]);
        }
        if (total > 256 * 1024)
                return cerr(error, "%s: annotations are larger than 256 KiB in total", where);
        return 0;
}

static int check_env(char *const *env, const char *where, char **error) {
        size_t i = 0;

        STRV_FOREACH(e, env) {
                const char *eq = strchr(*e, '=');
                if (!eq || eq == *e)
                        return cerr(error, "%s.env[%zu] \"%s\" is not an environment variable: write NAME=value", where, i, *e);
                i++;
        }
        return 0;
}

static int check_edits(const CdiEdits *e, const char *where, char **error) {
        static const char *const hook_names[] = { "prestart", "createRuntime", "createContainer",
                                                  "startContainer", "poststart", "poststop" };
        int r;

        r = check_env(e->env, where, error);
        if (r < 0)
                return r;

        for (size_t i = 0; i < e->n_device_nodes; i++) {
                const CdiDeviceNode *d = e->device_nodes + i;
                const char *t = d->type ?: "";
                if (isempty(d->path))
                        return cerr(error, "%s.deviceNodes[%zu] has no path: every device node needs one", where, i);
                if (!streq(t, "") && !streq(t, "b") && !streq(t, "c") && !streq(t, "u") && !streq(t, "p"))
                        return cerr(error, "%s.deviceNodes[%zu] (%s): type \"%s\" is not one of b, c, u, p (or leave it out)",
                                    where, i, d->path, t);
                if (d->major < 0 || d->minor < 0)
                        return cerr(error, "%s.deviceNodes[%zu] (%s): negative device number %" PRIi64 ":%" PRIi64,
                                    where, i, d->path, d->major, d->minor);
                if (d->permissions && d->permissions[strspn(d->permissions, "rwm")])
                        return cerr(error, "%s.deviceNodes[%zu] (%s): permissions \"%s\" must be made of r, w and m",
                                    where, i, d->path, d->permissions);
        }

        for (size_t i = 0; i < e->n_hooks; i++) {
                const CdiHook *h = e->hooks + i;
                bool known = false;
                for (size_t j = 0; j < ELEMENTSOF(hook_names); j++)
                        known = known || streq_ptr(h->hook_name, hook_names[j]);
                if (!known)
                        return cerr(error,
                                    "%s.hooks[%zu]: hookName \"%s\" is not an OCI hook (prestart, createRuntime, "
                                    "createContainer, startContainer, poststart, poststop)",
                                    where, i, (h->hook_name ?: ""));
                if (isempty(h->path))
                        return cerr(error, "%s.hooks[%zu] (%s) has no path", where, i, h->hook_name);
                _cleanup_free_ char *w = strprintf("%s.hooks[%zu]", where, i);
                if (!w)
                        return -ENOMEM;
                r = check_env(h->env, w, error);
                if (r < 0)
                        return r;
        }

        for (size_t i = 0; i < e->n_mounts; i++) {
                if (isempty(e->mounts[i].host_path))
                        return cerr(error, "%s.mounts[%zu] has no hostPath", where, i);
                if (isempty(e->mounts[i].container_path))
                        return cerr(error, "%s.mounts[%zu] (%s) has no containerPath", where, i, e->mounts[i].host_path);
        }

        if (e->intel_rdt && e->intel_rdt->clos_id) {
                const char *c = e->intel_rdt->clos_id;
                if (!streq(c, "/") && (strlen(c) >= 4096 || streq(c, ".") || streq(c, "..") || strpbrk(c, "/\n")))
                        return cerr(error, "%s.intelRdt.closID \"%s\" is not a valid file name", where, c);
        }

        for (size_t i = 0; i < e->n_net_devices; i++) {
                const CdiNetDevice *d = e->net_devices + i;
                if (isempty(d->host_interface_name) || isempty(d->name))
                        return cerr(error, "%s.netDevices[%zu] needs both hostInterfaceName and name", where, i);
                for (size_t j = 0; j < i; j++)
                        if (streq(e->net_devices[j].host_interface_name, d->host_interface_name) ||
                            streq(e->net_devices[j].name, d->name))
                                return cerr(error, "%s.netDevices[%zu] repeats netDevices[%zu]'s interface", where, i, j);
        }
        return 0;
}

static bool edits_are_empty(const CdiEdits *e) {
        return strv_length(e->env) == 0 && e->n_device_nodes == 0 && e->n_hooks == 0 && e->n_mounts == 0 &&
               e->n_additional_gids == 0 && !e->intel_rdt && e->n_net_devices == 0;
}

static int check_intel_rdt_version(const CdiEdits *e, const char *version, const char *where, char **error) {
        if (!e->intel_rdt || cdi_version_compare(version, "1.1.0") < 0)
                return 0;
        if (e->intel_rdt->seen_enable_cmt || e->intel_rdt->seen_enable_mbm)
                return cerr(error, "%s.intelRdt: enableCMT and enableMBM are not valid for cdiVersion %s; use enableMonitoring",
                            where, version);
        return 0;
}

int cdi_spec_check(const CdiSpec *s, char **ret_error) {
        const char *problem, *min;
        int r;

        /* Rule 1 */
        if (!cdi_version_is_known(s->version))
                return cerr(ret_error, "cdiVersion \"%s\" is not a CDI version the loader knows (0.3.0 to 1.1.0)",
                            (s->version ?: ""));
        min = cdi_spec_min_version(s);
        if (cdi_version_compare(s->version, min) < 0)
                return cerr(ret_error, "cdiVersion %s is lower than the content needs: set cdiVersion to %s or later",
                            s->version, min);

        /* Rule 2 for the kind */
        const char *kind = s->kind ?: "";
        const char *slash = strchr(kind, '/');
        if (!slash || slash == kind || !slash[1])
                return cerr(ret_error, "kind \"%s\" is not VENDOR/CLASS (e.g. nvidia.com/gpu)", kind);
        _cleanup_free_ char *vendor = strndup(kind, (size_t) (slash - kind));
        if (!vendor)
                return -ENOMEM;
        problem = vendor_class_problem(vendor);
        if (problem)
                return cerr(ret_error, "kind \"%s\": the vendor \"%s\" %s", kind, vendor, problem);
        problem = vendor_class_problem(slash + 1);
        if (problem)
                return cerr(ret_error, "kind \"%s\": the class \"%s\" %s", kind, slash + 1, problem);

        /* Rule 3 */
        r = check_annotations(s->annotations, "annotations", ret_error);
        if (r < 0)
                return r;

        r = check_edits(&s->edits, "containerEdits", ret_error);
        if (r < 0)
                return r;
        r = check_intel_rdt_version(&s->edits, s->version, "containerEdits", ret_error);
        if (r < 0)
                return r;

        /* Rules 2, 4, 5 for the devices */
        for (size_t i = 0; i < s->n_devices; i++) {
                const CdiDevice *d = s->devices + i;
                _cleanup_free_ char *where = strprintf("devices[%zu] (\"%s\")", i, (d->name ?: ""));
                if (!where)
                        return -ENOMEM;
                problem = device_name_problem(d->name ?: "");
                if (problem)
                        return cerr(ret_error, "%s: the device name %s", where, problem);
                r = check_annotations(d->annotations, where, ret_error);
                if (r < 0)
                        return r;
                if (edits_are_empty(&d->edits))
                        return cerr(ret_error, "%s has no containerEdits: a device must change something in the container", where);
                r = check_edits(&d->edits, where, ret_error);
                if (r < 0)
                        return r;
                r = check_intel_rdt_version(&d->edits, s->version, where, ret_error);
                if (r < 0)
                        return r;
                for (size_t j = 0; j < i; j++)
                        if (streq(s->devices[j].name, d->name))
                                return cerr(ret_error, "%s: the device name is used twice (also devices[%zu]); names must be unique",
                                            where, j);
        }
        if (s->n_devices == 0)
                return cerr(ret_error, "the spec has no devices: a CDI spec needs at least one");
        return 0;
}

int cdi_validate_text(const char *name, const char *data, size_t size, char **ret_error) {
        _cleanup_(cdi_spec_freep) CdiSpec *s = NULL;
        _cleanup_free_ char *error = NULL;
        int r;

        r = cdi_spec_parse(name, data, size, &s, ret_error);
        if (r < 0)
                return r;
        r = cdi_spec_check(s, &error);
        if (r < 0) {
                free(*ret_error);
                *ret_error = strprintf("%s: %s", name, strna(error));
        }
        return r;
}

