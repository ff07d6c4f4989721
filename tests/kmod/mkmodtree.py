#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Owns the fixture module trees: roots shaped like a host's /lib/modules, /lib/firmware and
/etc/modprobe.d, holding fake kernel modules that libkmod, modinfo and depmod read as real ones.

A fake .ko is a `cc -c` object with a .modinfo section (name=, version=, vermagic=, depends=,
alias=, firmware=, signer=, parm=; trap_init_error= for tests/fakes/kmod-trap.c) and a __ksymtab_strings section for the symbols it exports; a
module that needs another references one of its exported symbols, which leaves an undefined symbol
that depmod resolves into modules.dep exactly as it does for real modules. Each tree is indexed
with the real `depmod -b ROOT KVER`.

Usage: mkmodtree.py --out DIR --cc "CC" --depmod DEPMOD
DIR is removed first; every tree is DIR/<tree>/ with lib/modules/<KVER>/...; DIR/KVER names the
kernel release used for all trees.
"""

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

KVER = '6.1.0-18-amd64'
OLD_KVER = '6.1.0-17-amd64'
VERSION = '550.54.15'
OLD_VERSION = '535.161.07'
VERMAGIC_FLAGS = 'SMP preempt mod_unload modversions '
DKMS_SIGNER = 'DKMS module signing key'

FIRMWARE = ['nvidia/{v}/gsp_ga10x.bin', 'nvidia/{v}/gsp_tu10x.bin']


def mod(file, name, path='updates/dkms', version=VERSION, kver=KVER, exports=(), needs=(),
        depends=None, firmware=(), signer=DKMS_SIGNER, aliases=(), parms=(), init_error=None,
        flags=VERMAGIC_FLAGS, license=None):
    """One fake module. needs: (module file, symbol) pairs resolved by depmod; depends: the
    kernel names modpost would have written (defaults to the needed modules' kernel names);
    init_error: what the kmod trap makes the module's init return (trap_init_error=)."""
    return dict(file=file, name=name, path=path, version=version, kver=kver, exports=list(exports),
                needs=list(needs), depends=depends, firmware=list(firmware), signer=signer,
                aliases=list(aliases), parms=list(parms), init_error=init_error, flags=flags,
                license=license)


def ib_core():
    return mod('ib_core', 'ib_core', path='kernel/drivers/infiniband/core', version=None,
               exports=['ib_register_peer_memory_client'], signer='Debian Secure Boot CA')


def ipmi():
    return [mod('ipmi_msghandler', 'ipmi_msghandler', path='kernel/drivers/char/ipmi', version='39.2',
                exports=['ipmi_create_user'], signer='Debian Secure Boot CA'),
            mod('ipmi_devintf', 'ipmi_devintf', path='kernel/drivers/char/ipmi', version=None,
                needs=[('ipmi_msghandler', 'ipmi_create_user')], signer='Debian Secure Boot CA')]


def nvidia_set(prefix='nvidia', version=VERSION, kver=KVER, firmware=True, peermem='real', sym='',
               flags=VERMAGIC_FLAGS, license=None):
    """The driver's modules under their packaged file names (prefix 'nvidia' upstream,
    'nvidia-current' or 'nvidia-tesla-535' on Debian); kernel names are always nvidia*. sym suffixes
    the exported symbols so two branches in one tree do not resolve to each other."""
    fw = [f.format(v=version) for f in FIRMWARE] if firmware else []
    sep = '-'
    core = prefix
    mods = [mod(core, 'nvidia', version=version, kver=kver, firmware=fw,
                exports=['nvidia_get_rm_ops' + sym, 'nvidia_p2p_get_pages' + sym],
                aliases=['pci:v000010DEd*sv*sd*bc03sc02i00*', 'pci:v000010DEd*sv*sd*bc03sc00i00*'],
                parms=['NVreg_DeviceFileMode:int', 'NVreg_EnableGpuFirmware:int', 'NVreg_OpenRmEnableUnsupportedGpus:int',
                       'NVreg_RegistryDwords:charp']),
            mod(core + sep + 'uvm', 'nvidia_uvm', version=version, kver=kver,
                needs=[(core, 'nvidia_get_rm_ops' + sym)],
                parms=['uvm_perf_prefetch_enable:uint', 'uvm_ats_mode:int', 'uvm_disable_hmm:bool']),
            mod(core + sep + 'modeset', 'nvidia_modeset', version=version, kver=kver,
                needs=[(core, 'nvidia_get_rm_ops' + sym)], exports=['nvKmsKapiGetFunctionsTable' + sym],
                parms=['hdmi_deepcolor:bool']),
            mod(core + sep + 'drm', 'nvidia_drm', version=version, kver=kver,
                needs=[(core + sep + 'modeset', 'nvKmsKapiGetFunctionsTable' + sym)],
                depends=['nvidia-modeset'], parms=['modeset:bool'])]
    for m in mods:
        m['flags'] = flags
        # As NVIDIA ships them: nvidia.ko and nvidia-modeset.ko say "NVIDIA" in the proprietary
        # flavour, nvidia-uvm and nvidia-drm are "Dual MIT/GPL" in both; license= overrides (open).
        m['license'] = license or ('Dual MIT/GPL' if m['name'] in ('nvidia_uvm', 'nvidia_drm') else None)
    if peermem == 'real':
        mods.append(mod(core + sep + 'peermem', 'nvidia_peermem', version=version, kver=kver,
                        needs=[(core, 'nvidia_p2p_get_pages' + sym),
                               ('ib_core', 'ib_register_peer_memory_client')]))
    elif peermem == 'stub':
        # Built where no ib_core headers were found: NVIDIA's build then compiles a stub whose
        # init fails with -EINVAL, and modpost writes no ib_core dependency.
        mods.append(mod(core + sep + 'peermem', 'nvidia_peermem', version=version, kver=kver,
                        needs=[(core, 'nvidia_p2p_get_pages' + sym)], init_error='EINVAL'))
    return mods


def firmware_files(version=VERSION):
    return [f.format(v=version) for f in FIRMWARE]


# tree name -> description
TREES = {
    # NVIDIA's own packaging (.run, CUDA repo DKMS): file names equal kernel names.
    'upstream': dict(modules=nvidia_set() + [ib_core()] + ipmi(), firmware=firmware_files(),
                     modprobe={'nvidia.conf': 'options nvidia NVreg_DeviceFileMode=0660\n'
                                              'options nvidia-uvm uvm_perf_prefetch_enable=0\n'}),
    # Debian's nvidia-kernel-dkms: nvidia-current*.ko whose kernel name is nvidia*, loaded by
    # `modprobe nvidia` only through install lines (modules/module-load.c carries out Debian's redirects).
    'debian': dict(modules=nvidia_set('nvidia-current') + [ib_core()] + ipmi(), firmware=firmware_files(),
                   # Debian's nvidia-kernel-support /etc/modprobe.d/nvidia.conf (install and remove
                   # lines as shipped), plus options under the kernel name.
                   modprobe={'nvidia.conf':
                             'install nvidia modprobe -i nvidia-current $CMDLINE_OPTS\n'
                             'install nvidia-modeset modprobe nvidia ; modprobe -i nvidia-current-modeset $CMDLINE_OPTS\n'
                             'install nvidia-drm modprobe nvidia-modeset ; modprobe -i nvidia-current-drm $CMDLINE_OPTS\n'
                             'install nvidia-uvm modprobe nvidia ; modprobe -i nvidia-current-uvm $CMDLINE_OPTS\n'
                             'install nvidia-peermem modprobe nvidia ; modprobe -i nvidia-current-peermem $CMDLINE_OPTS\n'
                             'remove nvidia modprobe -r -i nvidia-drm nvidia-modeset nvidia-peermem nvidia-uvm nvidia\n'
                             'remove nvidia-modeset modprobe -r -i nvidia-drm nvidia-modeset\n'
                             'alias char-major-195* nvidia\n'
                             'options nvidia NVreg_DeviceFileMode=0660\n',
                             'nvidia-options.conf': 'options nvidia-current NVreg_EnableGpuFirmware=1\n'}),
    # Debian's nvidia-kernel-dkms and nvidia-open-kernel-dkms side by side: nvidia-current*.ko
    # (proprietary, license NVIDIA) and nvidia-current-open*.ko (open, Dual MIT/GPL), all kernel name nvidia*.
    'debian-both': dict(modules=nvidia_set('nvidia-current', peermem=None)
                        + nvidia_set('nvidia-current-open', peermem=None, sym='_open', license='Dual MIT/GPL'),
                        firmware=firmware_files(), modprobe={}),
    # Debian's nvidia-tesla-<branch>-kernel-dkms, two branches installed side by side.
    'tesla': dict(modules=nvidia_set('nvidia-tesla-470', version='470.239.06', firmware=False, peermem=None, sym='_470')
                  + nvidia_set('nvidia-tesla-535', version=OLD_VERSION, peermem=None, sym='_535'),
                  firmware=firmware_files(OLD_VERSION), modprobe={}),
    # Left over from the previous kernel: vermagic names another release.
    'stale': dict(modules=nvidia_set(kver=OLD_KVER, peermem=None), firmware=firmware_files(), modprobe={}),
    # Another driver version than the one the user space expects.
    'wrong-version': dict(modules=nvidia_set(version=OLD_VERSION, peermem=None),
                          firmware=firmware_files(OLD_VERSION), modprobe={}),
    # nvidia-peermem built without the InfiniBand stack.
    'peermem-stub': dict(modules=nvidia_set(peermem='stub') + [ib_core()], firmware=firmware_files(),
                         modprobe={}),
    # The GSP firmware package is not installed.
    'no-firmware': dict(modules=nvidia_set(peermem=None), firmware=firmware_files()[1:], modprobe={}),
    # The open kernel modules ("Dual MIT/GPL"), GSP firmware not installed: they cannot run without it.
    'open-no-firmware': dict(modules=nvidia_set(peermem=None, license='Dual MIT/GPL'),
                             firmware=firmware_files()[1:], modprobe={}),
    # Firmware where the kernel also looks: /lib/firmware/updates/<release> and /lib/firmware/updates.
    'firmware-updates': dict(modules=nvidia_set(peermem=None), firmware=[], modprobe={},
                             firmware_at={'updates/' + KVER: firmware_files()[:1],
                                          'updates': firmware_files()[1:]}),
    # Built for the previous release with the same vermagic flags (modversions), next to the running
    # kernel's own modules: the kernel accepts it (RHEL's weak-updates work this way).
    'weak': dict(modules=nvidia_set(kver=OLD_KVER, peermem=None) + ipmi(), firmware=firmware_files(), modprobe={}),
    # Built for the previous release and another configuration (no preempt, no modversions): refused.
    'stale-flags': dict(modules=nvidia_set(kver=OLD_KVER, peermem=None, flags='SMP mod_unload ') + ipmi(),
                        firmware=firmware_files(), modprobe={}),
    # modules.dep names nvidia.ko, but the file was deleted afterwards without depmod.
    'stale-dep': dict(modules=nvidia_set(peermem=None), firmware=firmware_files(), modprobe={},
                      remove=['updates/dkms/nvidia.ko']),
}


def c_string(s):
    return '"' + s.replace('\\', '\\\\').replace('"', '\\"') + '"'


def module_source(m, kernel_name_of):
    lines = ['/* generated by mkmodtree.py */']
    info = ['name=' + m['name']]
    if m['version']:
        info.append('version=' + m['version'])
    info.append('license=' + (m['license'] or ('NVIDIA' if m['name'].startswith('nvidia') else 'GPL')))
    for f in m['firmware']:
        info.append('firmware=' + f)
    for a in m['aliases']:
        info.append('alias=' + a)
    for p in m['parms']:
        pname, ptype = p.split(':')
        info.append('parmtype=%s:%s' % (pname, ptype))
        info.append('parm=%s:%s' % (pname, 'fixture parameter'))
    depends = m['depends']
    if depends is None:
        depends = sorted({kernel_name_of[f] for f, _ in m['needs']})
    info.append('depends=' + ','.join(d.replace('_', '-') if d.startswith('nvidia') else d for d in depends))
    info.append('retpoline=Y')
    if m['signer']:
        info.append('signer=' + m['signer'])
        info.append('sig_key=4F:1A:9C:22:6B:03:E7:5D:11:8A:C0:2E:94:37:B6:0F:55:DA:21:7C')
        info.append('sig_hashalgo=sha256')
    if m['init_error']:
        info.append('trap_init_error=' + m['init_error'])
    info.append('vermagic=' + m['kver'] + ' ' + m['flags'])
    for i, kv in enumerate(info):
        lines.append('static const char modinfo_%d[] __attribute__((section(".modinfo"), used, aligned(1))) = %s;'
                     % (i, c_string(kv)))
    for i, sym in enumerate(m['exports']):
        lines.append('int %s(void) { return %d; }' % (sym, i))
        lines.append('static const char ksymtab_%d[] __attribute__((section("__ksymtab_strings"), used, aligned(1))) = %s;'
                     % (i, c_string(sym)))
    for _, sym in m['needs']:
        lines.append('extern int %s(void);' % sym)
    lines.append('int init_module(void);')
    lines.append('int init_module(void) { return 0%s; }' % ''.join(' + %s()' % s for _, s in m['needs']))
    return '\n'.join(lines) + '\n'


def build_tree(root, tree, cc, depmod, tmp):
    kernel_name_of = {m['file']: m['name'] for m in tree['modules']}
    mdir = os.path.join(root, 'lib', 'modules', KVER)
    os.makedirs(mdir)
    for m in tree['modules']:
        src = os.path.join(tmp, m['file'] + '.c')
        with open(src, 'w') as f:
            f.write(module_source(m, kernel_name_of))
        dest = os.path.join(mdir, m['path'])
        os.makedirs(dest, exist_ok=True)
        subprocess.run(cc + ['-c', '-O0', '-fno-pic', '-o', os.path.join(dest, m['file'] + '.ko'), src],
                       check=True)
    order = [os.path.join(m['path'], m['file'] + '.ko') for m in tree['modules'] if m['path'].startswith('kernel/')]
    with open(os.path.join(mdir, 'modules.order'), 'w') as f:
        f.write(''.join(o + '\n' for o in order))
    for name in ('modules.builtin', 'modules.builtin.modinfo'):
        open(os.path.join(mdir, name), 'w').close()
    placed = [('', fw) for fw in tree['firmware']]
    for sub, files in tree.get('firmware_at', {}).items():
        placed += [(sub, fw) for fw in files]
    for sub, fw in placed:
        p = os.path.join(root, 'lib', 'firmware', sub, fw)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, 'wb') as f:
            f.write(b'\x7fGSP fixture firmware\n')
    confdir = os.path.join(root, 'etc', 'modprobe.d')
    os.makedirs(confdir)
    for name, text in tree['modprobe'].items():
        with open(os.path.join(confdir, name), 'w') as f:
            f.write(text)
    # An empty depmod.d of the tree's own, so the host's /etc/depmod.d cannot reorder anything.
    depmod_d = os.path.join(root, 'etc', 'depmod.d')
    os.makedirs(depmod_d)
    subprocess.run([depmod, '-C', depmod_d, '-b', root, KVER], check=True)
    if not os.path.exists(os.path.join(mdir, 'modules.dep.bin')):
        sys.exit('depmod wrote no modules.dep.bin in ' + mdir)
    for rel in tree.get('remove', []):
        os.unlink(os.path.join(mdir, rel))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--out', required=True)
    ap.add_argument('--cc', required=True, help='C compiler command line')
    ap.add_argument('--depmod', required=True)
    args = ap.parse_args()
    cc = shlex.split(args.cc)
    shutil.rmtree(args.out, ignore_errors=True)
    os.makedirs(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        for name, tree in TREES.items():
            t = os.path.join(tmp, name)
            os.makedirs(t)
            build_tree(os.path.join(args.out, name), tree, cc, args.depmod, t)
    with open(os.path.join(args.out, 'KVER'), 'w') as f:
        f.write(KVER + '\n')


if __name__ == '__main__':
    main()
