"""Which mnemonics the emulator implements, from the opcode tables (the closing figure: implemented / seen)."""

from __future__ import annotations

from speck.usbgpu.sim.rdna3 import salu, scalar, valu, vmem


def coverage() -> dict[str, tuple[set[str], set[str]]]:
    """Per encoding family: (mnemonics implemented, mnemonics known by name but not implemented)."""
    out: dict[str, tuple[set[str], set[str]]] = {}

    def add(family: str, name: str, implemented: bool) -> None:
        done, todo = out.setdefault(family, (set(), set()))
        (done if implemented else todo).add(name)

    for family, table in (("SOP1", salu.SOP1), ("SOP2", salu.SOP2), ("SOPC", salu.SOPC), ("SOPK", salu.SOPK)):
        for row in table.values():
            add(family, row.name, row.fn is not None or row.name in _SALU_BY_DISPATCHER)
    for name in salu.SOPP.values():
        add("SOPP", name, name in _SOPP_DONE)
    for name, count in scalar.SMEM.values():
        add("SMEM", name, count != 0)
    for family, vtable in (("VOP1", valu.VOP1), ("VOP2", valu.VOP2), ("VOP3", valu.VOP3), ("VOPC", valu.VOPC)):
        for vrow in vtable.values():
            add(family, vrow.name, vrow.fn is not None or vrow.name in _LANE_DONE)
    for vrow in valu.VOP3P.values():
        add("VOP3P", vrow.name, vrow.fn is not None)
    for vrow in {**valu.VOPD_X, **valu.VOPD_Y}.values():
        add("VOPD", vrow.name, vrow.fn is not None)
    for seg, prefix in vmem.SEGMENTS.items():
        for mop in vmem.FLAT_OPS.values():
            add("FLAT", f"{prefix}_{mop.name}", True)
        for atomic in vmem.FLAT_ATOMICS.values():
            add("FLAT", f"{prefix}_{atomic}", False)
        del seg
    for dop in vmem.DS_OPS.values():
        add("DS", dop.name, True)
    for name in vmem.DS_OTHER.values():
        add("DS", name, False)
    for name in vmem.MUBUF_NOPS.values():
        add("MUBUF", name, True)
    return out


_SALU_BY_DISPATCHER = {"s_getpc_b64", "s_getreg_b32", "s_setreg_b32", "s_setreg_imm32_b32", "s_waitcnt_vscnt"}
_SALU_BY_DISPATCHER |= {"s_waitcnt_vmcnt", "s_waitcnt_expcnt", "s_waitcnt_lgkmcnt"}
_SOPP_DONE = {"s_nop", "s_clause", "s_delay_alu", "s_waitcnt_depctr", "s_set_inst_prefetch_distance", "s_sleep"}
_SOPP_DONE |= {"s_setprio", "s_icache_inv", "s_incperflevel", "s_decperflevel", "s_ttracedata", "s_ttracedata_imm"}
_SOPP_DONE |= {"s_waitcnt", "s_denorm_mode", "s_round_mode", "s_trap", "s_endpgm", "s_barrier", "s_sendmsg"}
_SOPP_DONE |= {"s_branch", "s_cbranch_scc0", "s_cbranch_scc1", "s_cbranch_vccz", "s_cbranch_vccnz"}
_SOPP_DONE |= {"s_cbranch_execz", "s_cbranch_execnz"}
_LANE_DONE = {"v_readfirstlane_b32", "v_readlane_b32", "v_writelane_b32", "v_swap_b32"}
