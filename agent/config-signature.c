/* SPDX-License-Identifier: MIT */
/* Owns the remote configuration's signature check (see config-signature.h): libcrypto.so.3 loaded on
 * first use with the few EVP, PEM and BIO functions it needs declared here (no OpenSSL headers at build
 * time, as NVML's), the public key read from its PEM file, and one EVP_DigestVerify() per document. */
#include <dlfcn.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config-signature.h"
#include "fileio.h"
#include "macro.h"
#include "strv.h"

/* OpenSSL 3's library (Debian libssl3, RPM openssl-libs): on every node already, as the TLS library
 * of libcurl4, which the remote configuration loads first; so loading it costs nothing more there.
 * The ABI of these functions is stable across 3.x. */
#define LIBCRYPTO_SONAME "libcrypto.so.3"

typedef struct bio_st BIO;
typedef struct evp_pkey_st EVP_PKEY;
typedef struct evp_pkey_ctx_st EVP_PKEY_CTX;
typedef struct evp_md_ctx_st EVP_MD_CTX;
typedef struct evp_md_st EVP_MD;
typedef struct engine_st ENGINE;
typedef int pem_password_cb(char *buf, int size, int rwflag, void *userdata);

static BIO *(*sym_BIO_new_mem_buf)(const void *buf, int len);
static int (*sym_BIO_free)(BIO *a);
static EVP_PKEY *(*sym_PEM_read_bio_PUBKEY)(BIO *bp, EVP_PKEY **x, pem_password_cb *cb, void *u);
static void (*sym_EVP_PKEY_free)(EVP_PKEY *pkey);
static int (*sym_EVP_PKEY_is_a)(const EVP_PKEY *pkey, const char *name);
static int (*sym_EVP_PKEY_get_bits)(const EVP_PKEY *pkey);
static EVP_MD_CTX *(*sym_EVP_MD_CTX_new)(void);
static void (*sym_EVP_MD_CTX_free)(EVP_MD_CTX *ctx);
static int (*sym_EVP_DigestVerifyInit)(EVP_MD_CTX *ctx, EVP_PKEY_CTX **pctx, const EVP_MD *type, ENGINE *e,
                                       EVP_PKEY *pkey);
static int (*sym_EVP_DigestVerify)(EVP_MD_CTX *ctx, const unsigned char *sig, size_t siglen,
                                   const unsigned char *tbs, size_t tbslen);
static const EVP_MD *(*sym_EVP_sha256)(void);
static unsigned long (*sym_ERR_get_error)(void);
static void (*sym_ERR_error_string_n)(unsigned long e, char *buf, size_t len);
static void (*sym_ERR_clear_error)(void);

/* Loaded once, never unloaded (OpenSSL keeps global state and an atexit handler in it). */
static int crypto_dlopen(char **ret_msg) {
        static void *dl = NULL;

        if (dl)
                return 0;
        void *h = dlopen(LIBCRYPTO_SONAME, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
                const char *e = dlerror();
                *ret_msg = strprintf("cannot load %s, which checks the signature of the remote configuration: %s; "
                                     "install OpenSSL's library (Debian: libssl3, RPM: openssl-libs)",
                                     LIBCRYPTO_SONAME, e ? e : "dlopen failed");
                return -EOPNOTSUPP;
        }
#define CRYPTO_SYM(n) { #n, (void **) &sym_##n }
        static const struct {
                const char *name;
                void **ptr;
        } syms[] = {
                CRYPTO_SYM(BIO_new_mem_buf),
                CRYPTO_SYM(BIO_free),
                CRYPTO_SYM(PEM_read_bio_PUBKEY),
                CRYPTO_SYM(EVP_PKEY_free),
                CRYPTO_SYM(EVP_PKEY_is_a),
                CRYPTO_SYM(EVP_PKEY_get_bits),
                CRYPTO_SYM(EVP_MD_CTX_new),
                CRYPTO_SYM(EVP_MD_CTX_free),
                CRYPTO_SYM(EVP_DigestVerifyInit),
                CRYPTO_SYM(EVP_DigestVerify),
                CRYPTO_SYM(EVP_sha256),
                CRYPTO_SYM(ERR_get_error),
                CRYPTO_SYM(ERR_error_string_n),
                CRYPTO_SYM(ERR_clear_error),
        };
#undef CRYPTO_SYM
        for (size_t i = 0; i < ELEMENTSOF(syms); i++) {
                *syms[i].ptr = dlsym(h, syms[i].name);
                if (!*syms[i].ptr) {
                        *ret_msg = strprintf("%s has no %s: not OpenSSL 3's libcrypto", LIBCRYPTO_SONAME,
                                             syms[i].name);
                        dlclose(h);
                        return -EOPNOTSUPP;
                }
        }
        dl = h;
        return 0;
}

/* The oldest error OpenSSL queued, in its words, or NULL; the queue is emptied. */
static char *crypto_error(void) {
        unsigned long e = sym_ERR_get_error();
        char buf[256];

        sym_ERR_clear_error();
        if (e == 0)
                return NULL;
        sym_ERR_error_string_n(e, buf, sizeof(buf));
        return strdup(buf);
}

typedef struct Key {
        EVP_PKEY *pkey;
        const EVP_MD *md;         /* NULL: the scheme signs the message itself (EdDSA) */
        const char *kind;
} Key;

static void key_done(Key *k) {
        if (k->pkey)
                sym_EVP_PKEY_free(k->pkey);
        *k = (Key) {};
}

static int key_load(const char *path, Key *ret, char **ret_msg) {
        _cleanup_free_ char *text = NULL;
        size_t size;
        int r;

        r = read_full_file(path, 64 * 1024, &text, &size);
        if (r < 0) {
                *ret_msg = strprintf("%s: cannot read the public key: %s", path, strerror(-r));
                return r;
        }
        if (strstr(text, "PRIVATE KEY-----")) {
                *ret_msg = strprintf("%s is a private key; the node needs only the public key (openssl pkey -in "
                                     "KEY -pubout -out %s), and the private key belongs where the documents "
                                     "are signed", path, path);
                return -EINVAL;
        }
        r = crypto_dlopen(ret_msg);
        if (r < 0)
                return r;
        BIO *bio = sym_BIO_new_mem_buf(text, (int) size);
        if (!bio)
                return -ENOMEM;
        EVP_PKEY *pkey = sym_PEM_read_bio_PUBKEY(bio, NULL, NULL, NULL);
        sym_BIO_free(bio);
        if (!pkey) {
                _cleanup_free_ char *e = crypto_error();
                *ret_msg = strprintf("%s: not a PEM public key (\"-----BEGIN PUBLIC KEY-----\", as openssl pkey "
                                     "-pubout writes it)%s%s", path, e ? ": " : "", e ?: "");
                return -EINVAL;
        }
        Key k = { .pkey = pkey };
        if (sym_EVP_PKEY_is_a(pkey, "ED25519"))
                k.kind = "Ed25519";
        else if (sym_EVP_PKEY_is_a(pkey, "ED448"))
                k.kind = "Ed448";
        else if (sym_EVP_PKEY_is_a(pkey, "EC")) {
                k.kind = "ECDSA";
                k.md = sym_EVP_sha256();
        } else if (sym_EVP_PKEY_is_a(pkey, "RSA") && sym_EVP_PKEY_get_bits(pkey) >= 2048) {
                k.kind = "RSA";
                k.md = sym_EVP_sha256();
        } else {
                bool rsa = sym_EVP_PKEY_is_a(pkey, "RSA");
                *ret_msg = strprintf("%s: %s; use an Ed25519 key (openssl genpkey -algorithm ed25519), or ECDSA, "
                                     "or RSA of 2048 bits or more", path,
                                     rsa ? "an RSA key shorter than 2048 bits is too weak" : "not a key type "
                                                                                             "the agent verifies with");
                sym_EVP_PKEY_free(pkey);
                return -EINVAL;
        }
        *ret = k;
        return 0;
}

int config_signature_key_check(const char *path, char **ret_msg) {
        Key k = {};
        int r = key_load(path, &k, ret_msg);
        if (r >= 0)
                key_done(&k);
        return r;
}

/* sig as base64 text when every byte is of its alphabet (a raw signature of 64 or more random bytes
 * never is), otherwise as it is. */
static int signature_decode(const uint8_t *sig, size_t size, uint8_t **ret, size_t *ret_size) {
        static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        _cleanup_free_ uint8_t *out = malloc(size + 1);
        bool text = size > 0, padding = false;
        uint32_t acc = 0;
        size_t n = 0, bits = 0;

        if (!out)
                return -ENOMEM;
        for (size_t i = 0; text && i < size; i++) {
                const char *c = sig[i] ? strchr(alphabet, sig[i]) : NULL;
                if (strchr(" \t\r\n", sig[i]) && sig[i])
                        continue;
                if (sig[i] == '=') {
                        padding = true;
                        continue;
                }
                if (!c || padding) {
                        text = false;
                        break;
                }
                acc = (acc << 6) | (uint32_t) (c - alphabet);
                bits += 6;
                if (bits >= 8) {
                        bits -= 8;
                        out[n++] = (uint8_t) ((acc >> bits) & 0xff);
                }
        }
        if (!text) {
                memcpy(out, sig, size);
                n = size;
        }
        *ret = TAKE_PTR(out);
        *ret_size = n;
        return 0;
}

int config_signature_verify(const char *key_path, const void *data, size_t size, const void *sig,
                            size_t sig_size, char **ret_msg) {
        _cleanup_free_ uint8_t *raw = NULL;
        Key k = {};
        size_t raw_size;
        int r;

        if (sig_size > 64 * 1024) {
                *ret_msg = strprintf("the signature is %zu bytes long; this is not a signature", sig_size);
                return -EBADMSG;
        }
        r = key_load(key_path, &k, ret_msg);
        if (r < 0)
                return r;
        r = signature_decode(sig, sig_size, &raw, &raw_size);
        if (r < 0) {
                key_done(&k);
                return r;
        }
        EVP_MD_CTX *ctx = sym_EVP_MD_CTX_new();
        if (!ctx) {
                key_done(&k);
                return -ENOMEM;
        }
        if (sym_EVP_DigestVerifyInit(ctx, NULL, k.md, NULL, k.pkey) != 1) {
                _cleanup_free_ char *e = crypto_error();
                *ret_msg = strprintf("cannot set up the %s key in %s: %s", k.kind, key_path, strna(e));
                r = -EIO;
        } else if (sym_EVP_DigestVerify(ctx, raw, raw_size, data, size) != 1) {
                sym_ERR_clear_error();
                *ret_msg = strprintf("the signature does not verify with the %s key in %s: the document or its "
                                     "signature was changed, or they were signed with another key", k.kind, key_path);
                r = -EBADMSG;
        } else
                r = 0;
        sym_EVP_MD_CTX_free(ctx);
        key_done(&k);
        return r;
}
