#!/usr/bin/env python3
"""Generate speck.usbgpu.amd.tables from the Linux kernel's public amdgpu headers.

Reads the members below straight out of Debian's linux-source-6.12 tarball (tarfile; nothing is extracted) and writes
the subset of AMD hardware facts speck uses - register offsets, reset values and fields of GC 11.0.0 (with SDMA 6.0),
NBIO 4.3, OSSSYS 6.0, MP 13.0.0 and MMHUB 3.0; PM4 type-3 opcodes and fields; SDMA 6.0 packet layouts; the IP
discovery, firmware header, PSP command, MQD and page-table formats; interrupt source ids and doorbell assignments -
into one Python module that both the driver (speck.usbgpu.amd) and the simulator (speck.usbgpu.sim) read.

What the headers state only as C code or comments (which dword of a PM4 packet a field lives in, the meaning of
WAIT_REG_MEM's function codes, the IH ring entry layout) is transcribed in the tables of this script, each naming the
header or function it comes from; everything else is parsed.

Usage (from the repository root):
    python3 packages/usbgpu/tools/gen_amd_tables.py [--source /usr/src/linux-source-6.12.tar.xz] [--check]
--check compares the committed module with what the source produces (exit status 1 on a difference).
"""

from __future__ import annotations

import argparse
import hashlib
import pathlib
import re
import subprocess
import sys
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass, field

ROOT = pathlib.Path(__file__).resolve().parents[3]
OUT = ROOT / "packages/usbgpu/src/speck/usbgpu/amd/tables.py"
DEFAULT_SOURCE = pathlib.Path("/usr/src/linux-source-6.12.tar.xz")
PACKAGE = "linux-source-6.12"
AMD = "drivers/gpu/drm/amd/"

# ---------------------------------------------------------------------------------------------------- the members
REG_HEADERS = {  # IP block -> (offset header, sh_mask header, default header or None)
    "GC": (
        "include/asic_reg/gc/gc_11_0_0_offset.h",
        "include/asic_reg/gc/gc_11_0_0_sh_mask.h",
        "include/asic_reg/gc/gc_11_0_0_default.h",
    ),
    "NBIO": ("include/asic_reg/nbio/nbio_4_3_0_offset.h", "include/asic_reg/nbio/nbio_4_3_0_sh_mask.h", None),
    "OSSSYS": ("include/asic_reg/oss/osssys_6_0_0_offset.h", "include/asic_reg/oss/osssys_6_0_0_sh_mask.h", None),
    "MP": ("include/asic_reg/mp/mp_13_0_0_offset.h", "include/asic_reg/mp/mp_13_0_0_sh_mask.h", None),
    "MMHUB": ("include/asic_reg/mmhub/mmhub_3_0_0_offset.h", "include/asic_reg/mmhub/mmhub_3_0_0_sh_mask.h", None),
}
NVD = "amdgpu/nvd.h"
SDMA_PKT = "amdgpu/sdma_v6_0_0_pkt_open.h"
SOC21_ENUM = "include/soc21_enum.h"
DISCOVERY = "include/discovery.h"
DISCOVERY_DRV_H = "amdgpu/amdgpu_discovery.h"
DISCOVERY_DRV_C = "amdgpu/amdgpu_discovery.c"
HW_IP = "include/soc15_hw_ip.h"
UCODE = "amdgpu/amdgpu_ucode.h"
PSP_IF = "amdgpu/psp_gfx_if.h"
MQD = "include/v11_structs.h"
VM_H = "amdgpu/amdgpu_vm.h"
DOORBELL_H = "amdgpu/amdgpu_doorbell.h"
IH_CLIENT = "include/soc15_ih_clientid.h"
IH_SRC_GFX = "include/ivsrcid/gfx/irqsrcs_gfx_11_0_0.h"
IH_C = "amdgpu/amdgpu_ih.c"
IP_OFFSET = "include/sienna_cichlid_ip_offset.h"
GFXHUB_C = "amdgpu/gfxhub_v3_0.c"
PSP_H = "amdgpu/amdgpu_psp.h"
SMU_MSG = "pm/swsmu/inc/pmfw_if/smu_v13_0_0_ppsmc.h"

# ---------------------------------------------------------------------------------------------------- what speck uses
REGISTERS: dict[str, list[str]] = {
    "GC": [
        # SDMA 6.0 engine 0, queue 0 (the SDMA blocks live in GC on gfx11)
        "SDMA0_F32_CNTL",
        "SDMA0_CNTL",
        "SDMA0_STATUS_REG",
        "SDMA0_WATCHDOG_CNTL",
        "SDMA0_UTCL1_CNTL",
        "SDMA0_UTCL1_PAGE",
        "SDMA0_SEM_WAIT_FAIL_TIMER_CNTL",
        "SDMA0_QUEUE0_RB_CNTL",
        "SDMA0_QUEUE0_RB_BASE",
        "SDMA0_QUEUE0_RB_BASE_HI",
        "SDMA0_QUEUE0_RB_RPTR",
        "SDMA0_QUEUE0_RB_RPTR_HI",
        "SDMA0_QUEUE0_RB_WPTR",
        "SDMA0_QUEUE0_RB_WPTR_HI",
        "SDMA0_QUEUE0_RB_RPTR_ADDR_HI",
        "SDMA0_QUEUE0_RB_RPTR_ADDR_LO",
        "SDMA0_QUEUE0_RB_WPTR_POLL_ADDR_HI",
        "SDMA0_QUEUE0_RB_WPTR_POLL_ADDR_LO",
        "SDMA0_QUEUE0_IB_CNTL",
        "SDMA0_QUEUE0_DOORBELL",
        "SDMA0_QUEUE0_DOORBELL_OFFSET",
        "SDMA0_QUEUE0_MINOR_PTR_UPDATE",
        "SDMA0_QUEUE0_CONTEXT_STATUS",
        # GRBM queue select and status
        "GRBM_GFX_CNTL",
        "GRBM_STATUS",
        # CP: MEC control, doorbell range, the compute HQD registers, the MQD pointer
        "CP_MEC_RS64_CNTL",
        "CP_MEC_DOORBELL_RANGE_LOWER",
        "CP_MEC_DOORBELL_RANGE_UPPER",
        "CP_PQ_STATUS",
        "CP_PQ_WPTR_POLL_CNTL",
        "CP_MQD_BASE_ADDR",
        "CP_MQD_BASE_ADDR_HI",
        "CP_MQD_CONTROL",
        "CP_HQD_ACTIVE",
        "CP_HQD_VMID",
        "CP_HQD_PERSISTENT_STATE",
        "CP_HQD_PIPE_PRIORITY",
        "CP_HQD_QUEUE_PRIORITY",
        "CP_HQD_QUANTUM",
        "CP_HQD_PQ_BASE",
        "CP_HQD_PQ_BASE_HI",
        "CP_HQD_PQ_RPTR",
        "CP_HQD_PQ_RPTR_REPORT_ADDR",
        "CP_HQD_PQ_RPTR_REPORT_ADDR_HI",
        "CP_HQD_PQ_WPTR_POLL_ADDR",
        "CP_HQD_PQ_WPTR_POLL_ADDR_HI",
        "CP_HQD_PQ_DOORBELL_CONTROL",
        "CP_HQD_PQ_CONTROL",
        "CP_HQD_IB_CONTROL",
        "CP_HQD_DEQUEUE_REQUEST",
        "CP_HQD_HQ_STATUS0",
        "CP_HQD_EOP_BASE_ADDR",
        "CP_HQD_EOP_BASE_ADDR_HI",
        "CP_HQD_EOP_CONTROL",
        "CP_HQD_ERROR",
        "CP_HQD_PQ_WPTR_LO",
        "CP_HQD_PQ_WPTR_HI",
        "CP_MES_MTIME_LO",
        "CP_MES_MTIME_HI",
        # the COMPUTE_* dispatch state SET_SH_REG programs
        "COMPUTE_DISPATCH_INITIATOR",
        "COMPUTE_DIM_X",
        "COMPUTE_DIM_Y",
        "COMPUTE_DIM_Z",
        "COMPUTE_START_X",
        "COMPUTE_START_Y",
        "COMPUTE_START_Z",
        "COMPUTE_NUM_THREAD_X",
        "COMPUTE_NUM_THREAD_Y",
        "COMPUTE_NUM_THREAD_Z",
        "COMPUTE_PGM_LO",
        "COMPUTE_PGM_HI",
        "COMPUTE_DISPATCH_SCRATCH_BASE_LO",
        "COMPUTE_DISPATCH_SCRATCH_BASE_HI",
        "COMPUTE_PGM_RSRC1",
        "COMPUTE_PGM_RSRC2",
        "COMPUTE_PGM_RSRC3",
        "COMPUTE_RESOURCE_LIMITS",
        "COMPUTE_TMPRING_SIZE",
        "COMPUTE_STATIC_THREAD_MGMT_SE0",
        "COMPUTE_STATIC_THREAD_MGMT_SE1",
        "COMPUTE_STATIC_THREAD_MGMT_SE2",
        "COMPUTE_STATIC_THREAD_MGMT_SE3",
        *[f"COMPUTE_USER_DATA_{i}" for i in range(16)],
        # GFX hub: framebuffer location, apertures, L1 TLB / L2, VM contexts 0 and 1, faults, TLB invalidation
        "GCMC_VM_FB_LOCATION_BASE",
        "GCMC_VM_FB_LOCATION_TOP",
        "GCMC_VM_FB_OFFSET",
        "GCMC_VM_AGP_BASE",
        "GCMC_VM_AGP_BOT",
        "GCMC_VM_AGP_TOP",
        "GCMC_VM_SYSTEM_APERTURE_LOW_ADDR",
        "GCMC_VM_SYSTEM_APERTURE_HIGH_ADDR",
        "GCMC_VM_SYSTEM_APERTURE_DEFAULT_ADDR_LSB",
        "GCMC_VM_SYSTEM_APERTURE_DEFAULT_ADDR_MSB",
        "GCMC_VM_MX_L1_TLB_CNTL",
        "GCVM_L2_CNTL",
        "GCVM_L2_CNTL2",
        "GCVM_L2_CNTL3",
        "GCVM_CONTEXT0_CNTL",
        "GCVM_CONTEXT1_CNTL",
        "GCVM_CONTEXT1_PAGE_TABLE_BASE_ADDR_LO32",
        "GCVM_CONTEXT1_PAGE_TABLE_BASE_ADDR_HI32",
        "GCVM_CONTEXT1_PAGE_TABLE_START_ADDR_LO32",
        "GCVM_CONTEXT1_PAGE_TABLE_START_ADDR_HI32",
        "GCVM_CONTEXT1_PAGE_TABLE_END_ADDR_LO32",
        "GCVM_CONTEXT1_PAGE_TABLE_END_ADDR_HI32",
        "GCVM_L2_PROTECTION_FAULT_CNTL",
        "GCVM_L2_PROTECTION_FAULT_CNTL2",
        "GCVM_L2_PROTECTION_FAULT_STATUS",
        "GCVM_L2_PROTECTION_FAULT_ADDR_LO32",
        "GCVM_L2_PROTECTION_FAULT_ADDR_HI32",
        "GCVM_L2_PROTECTION_FAULT_DEFAULT_ADDR_LO32",
        "GCVM_L2_PROTECTION_FAULT_DEFAULT_ADDR_HI32",
        "GCVM_INVALIDATE_ENG17_REQ",
        "GCVM_INVALIDATE_ENG17_ACK",
    ],
    "NBIO": [
        "RCC_DEV0_EPF0_RCC_CONFIG_MEMSIZE",
        "RCC_DEV0_EPF0_RCC_DOORBELL_APER_EN",
        "S2A_DOORBELL_ENTRY_2_CTRL",
        "BIF_BX0_REMAP_HDP_MEM_FLUSH_CNTL",
        "BIF_BX_PF0_GPU_HDP_FLUSH_REQ",
        "BIF_BX_PF0_GPU_HDP_FLUSH_DONE",
        "BIF_BX0_BIF_FB_EN",
        "BIF_BX_PF0_RSMU_INDEX",
        "BIF_BX_PF0_RSMU_DATA",
    ],
    "OSSSYS": [
        "IH_RB_CNTL",
        "IH_RB_BASE",
        "IH_RB_BASE_HI",
        "IH_RB_RPTR",
        "IH_RB_WPTR",
        "IH_RB_WPTR_ADDR_HI",
        "IH_RB_WPTR_ADDR_LO",
        "IH_DOORBELL_RPTR",
        "IH_CNTL",
    ],
    "MP": [
        "MP0_SMN_C2PMSG_33",
        "MP0_SMN_C2PMSG_35",
        "MP0_SMN_C2PMSG_36",
        "MP0_SMN_C2PMSG_64",
        "MP0_SMN_C2PMSG_67",
        "MP0_SMN_C2PMSG_69",
        "MP0_SMN_C2PMSG_70",
        "MP0_SMN_C2PMSG_71",
        "MP0_SMN_C2PMSG_81",
        "MP1_SMN_C2PMSG_66",
        "MP1_SMN_C2PMSG_82",
        "MP1_SMN_C2PMSG_90",
    ],
    "MMHUB": [
        "MMMC_VM_FB_LOCATION_BASE",
        "MMMC_VM_FB_LOCATION_TOP",
        "MMMC_VM_SYSTEM_APERTURE_LOW_ADDR",
        "MMMC_VM_SYSTEM_APERTURE_HIGH_ADDR",
        "MMMC_VM_MX_L1_TLB_CNTL",
        "MMVM_CONTEXT0_CNTL",
    ],
}

PM4_OPCODES = [
    "NOP",
    "SET_SH_REG",
    "DISPATCH_DIRECT",
    "ACQUIRE_MEM",
    "RELEASE_MEM",
    "WAIT_REG_MEM",
    "INDIRECT_BUFFER",
    "WRITE_DATA",
]
PM4_DEFINES = ["PACKET_TYPE3", "PACKET3_SET_SH_REG_START"]
# PM4 packets: field -> (dword counted from the header, nvd.h macro giving the shift, width). nvd.h states shifts
# only, so a macro field (width None) reaches up to the next field of its dword (or the dword's top); a flag macro
# (1 << n) is one bit. A literal shift and width describe an address, size or data dword the headers leave implicit.
# Dword positions come from the packet comments in nvd.h (ACQUIRE_MEM) and the gfx_v11_0.c emitters
# (gfx_v11_0_ring_emit_fence_kiq/_fence: RELEASE_MEM, gfx_v11_0_wait_reg_mem: WAIT_REG_MEM,
# gfx_v11_0_ring_emit_ib_compute: INDIRECT_BUFFER, gfx_v11_0_ring_emit_wreg/amdgpu_ring_emit_wreg: WRITE_DATA).
PM4_FIELD = tuple[int, "str | int", "int | None"]
PM4_PACKETS: dict[str, tuple[int, dict[str, PM4_FIELD]]] = {
    "HEADER": (
        1,
        {
            "predicate": (0, 0, 1),
            "shader_type": (0, 1, 1),  # PACKET3_COMPUTE(op, n): PACKET3(op, n) | 1 << 1
            "opcode": (0, "CP_PACKET3_GET_OPCODE", None),
            "count": (0, "CP_PACKET_GET_COUNT", None),
            "type": (0, "CP_PACKET_GET_TYPE", None),
        },
    ),
    "SET_SH_REG": (2, {"reg_offset": (1, 0, 16)}),  # then the register values
    "DISPATCH_DIRECT": (
        5,
        {"dim_x": (1, 0, 32), "dim_y": (2, 0, 32), "dim_z": (3, 0, 32), "dispatch_initiator": (4, 0, 32)},
    ),
    "ACQUIRE_MEM": (
        8,
        {
            "coher_cntl": (1, 0, 31),
            "engine_sel": (1, 31, 1),
            "coher_size": (2, 0, 32),
            "coher_size_hi": (3, 0, 24),  # gfx_v11_0_emit_mem_sync writes 24 bits
            "coher_base_lo": (4, 0, 32),
            "coher_base_hi": (5, 0, 24),
            "poll_interval": (6, 0, 16),
            "gcr_gli_inv": (7, "PACKET3_ACQUIRE_MEM_GCR_CNTL_GLI_INV", None),
            "gcr_gl1_range": (7, "PACKET3_ACQUIRE_MEM_GCR_CNTL_GL1_RANGE", None),
            "gcr_glm_wb": (7, "PACKET3_ACQUIRE_MEM_GCR_CNTL_GLM_WB", None),
            "gcr_glm_inv": (7, "PACKET3_ACQUIRE_MEM_GCR_CNTL_GLM_INV", None),
            "gcr_glk_wb": (7, "PACKET3_ACQUIRE_MEM_GCR_CNTL_GLK_WB", None),
            "gcr_glk_inv": (7, "PACKET3_ACQUIRE_MEM_GCR_CNTL_GLK_INV", None),
            "gcr_glv_inv": (7, "PACKET3_ACQUIRE_MEM_GCR_CNTL_GLV_INV", None),
            "gcr_gl1_inv": (7, "PACKET3_ACQUIRE_MEM_GCR_CNTL_GL1_INV", None),
            "gcr_gl2_us": (7, "PACKET3_ACQUIRE_MEM_GCR_CNTL_GL2_US", None),
            "gcr_gl2_range": (7, "PACKET3_ACQUIRE_MEM_GCR_CNTL_GL2_RANGE", None),
            "gcr_gl2_discard": (7, "PACKET3_ACQUIRE_MEM_GCR_CNTL_GL2_DISCARD", None),
            "gcr_gl2_inv": (7, "PACKET3_ACQUIRE_MEM_GCR_CNTL_GL2_INV", None),
            "gcr_gl2_wb": (7, "PACKET3_ACQUIRE_MEM_GCR_CNTL_GL2_WB", None),
            "gcr_seq": (7, "PACKET3_ACQUIRE_MEM_GCR_CNTL_SEQ", None),
            "gcr_range_is_pa": (7, "PACKET3_ACQUIRE_MEM_GCR_RANGE_IS_PA", None),
        },
    ),
    "RELEASE_MEM": (
        8,
        {
            "event_type": (1, "PACKET3_RELEASE_MEM_EVENT_TYPE", None),
            "event_index": (1, "PACKET3_RELEASE_MEM_EVENT_INDEX", None),
            "gcr_glm_wb": (1, "PACKET3_RELEASE_MEM_GCR_GLM_WB", None),
            "gcr_glm_inv": (1, "PACKET3_RELEASE_MEM_GCR_GLM_INV", None),
            "gcr_glv_inv": (1, "PACKET3_RELEASE_MEM_GCR_GLV_INV", None),
            "gcr_gl1_inv": (1, "PACKET3_RELEASE_MEM_GCR_GL1_INV", None),
            "gcr_gl2_us": (1, "PACKET3_RELEASE_MEM_GCR_GL2_US", None),
            "gcr_gl2_range": (1, "PACKET3_RELEASE_MEM_GCR_GL2_RANGE", None),
            "gcr_gl2_discard": (1, "PACKET3_RELEASE_MEM_GCR_GL2_DISCARD", None),
            "gcr_gl2_inv": (1, "PACKET3_RELEASE_MEM_GCR_GL2_INV", None),
            "gcr_gl2_wb": (1, "PACKET3_RELEASE_MEM_GCR_GL2_WB", None),
            "gcr_seq": (1, "PACKET3_RELEASE_MEM_GCR_SEQ", None),
            "cache_policy": (1, "PACKET3_RELEASE_MEM_CACHE_POLICY", None),
            "execute": (1, "PACKET3_RELEASE_MEM_EXECUTE", None),
            "dst_sel": (2, "PACKET3_RELEASE_MEM_DST_SEL", None),
            "int_sel": (2, "PACKET3_RELEASE_MEM_INT_SEL", None),
            "data_sel": (2, "PACKET3_RELEASE_MEM_DATA_SEL", None),
            "addr_lo": (3, 0, 32),
            "addr_hi": (4, 0, 32),
            "data_lo": (5, 0, 32),
            "data_hi": (6, 0, 32),
            "int_ctxid": (7, 0, 32),
        },
    ),
    "WAIT_REG_MEM": (
        7,
        {
            "function": (1, "WAIT_REG_MEM_FUNCTION", None),
            "mem_space": (1, "WAIT_REG_MEM_MEM_SPACE", None),
            "operation": (1, "WAIT_REG_MEM_OPERATION", None),
            "engine": (1, "WAIT_REG_MEM_ENGINE", None),
            "addr_lo": (2, 0, 32),
            "addr_hi": (3, 0, 32),
            "reference": (4, 0, 32),
            "mask": (5, 0, 32),
            "poll_interval": (6, 0, 16),
        },
    ),
    "INDIRECT_BUFFER": (
        4,
        {
            "ib_base_lo": (1, 0, 32),
            "ib_base_hi": (2, 0, 16),
            "ib_size": (3, 0, 20),
            "pre_enb": (3, "INDIRECT_BUFFER_PRE_ENB", None),
            "valid": (3, "INDIRECT_BUFFER_VALID", None),
            "vmid": (3, 24, 4),
            "cache_policy": (3, "INDIRECT_BUFFER_CACHE_POLICY", None),
            "pre_resume": (3, "INDIRECT_BUFFER_PRE_RESUME", None),
        },
    ),
    "WRITE_DATA": (
        4,
        {
            "dst_sel": (1, "WRITE_DATA_DST_SEL", None),
            "wr_one_addr": (1, "WR_ONE_ADDR", None),
            "wr_confirm": (1, "WR_CONFIRM", None),
            "cache_policy": (1, "WRITE_DATA_CACHE_POLICY", None),
            "engine_sel": (1, "WRITE_DATA_ENGINE_SEL", None),
            "dst_addr_lo": (2, 0, 32),
            "dst_addr_hi": (3, 0, 32),
        },
    ),  # then the data dwords
    "NOP": (1, {}),
}
# Field values the headers give only in comments (nvd.h, under the macro named).
PM4_VALUES: dict[str, tuple[str, dict[str, int]]] = {
    "WAIT_FUNCTION": ("WAIT_REG_MEM_FUNCTION", {"ALWAYS": 0, "LT": 1, "LE": 2, "EQ": 3, "NE": 4, "GE": 5, "GT": 6}),
    "WAIT_MEM_SPACE": ("WAIT_REG_MEM_MEM_SPACE", {"REGISTER": 0, "MEMORY": 1}),
    "WRITE_DST_SEL": ("WRITE_DATA_DST_SEL", {"REGISTER": 0, "MEMORY_SYNC": 1, "TC_L2": 2, "MEMORY": 5}),
    "RELEASE_DATA_SEL": (
        "PACKET3_RELEASE_MEM_DATA_SEL",
        {"NONE": 0, "DATA32": 1, "DATA64": 2, "GPU_CLOCK": 3, "SYSTEM_CLOCK": 4},
    ),
    "RELEASE_INT_SEL": ("PACKET3_RELEASE_MEM_INT_SEL", {"NONE": 0, "INTERRUPT": 1, "AFTER_WRITE_CONFIRM": 2}),
    "RELEASE_DST_SEL": ("PACKET3_RELEASE_MEM_DST_SEL", {"MEMORY": 0, "TC_L2": 1}),
}
EVENT_TYPES = ["CS_PARTIAL_FLUSH", "CACHE_FLUSH_AND_INV_TS_EVENT", "BOTTOM_OF_PIPE_TS"]  # soc21_enum.h VGT_EVENT_TYPE
SDMA_OPS = ["NOP", "COPY", "WRITE", "FENCE", "TRAP", "POLL_REGMEM", "CONST_FILL", "TIMESTAMP"]
SDMA_SUBOPS = ["COPY_LINEAR", "WRITE_LINEAR", "TIMESTAMP_GET_GLOBAL"]
SDMA_PACKETS = [
    "NOP",
    "COPY_LINEAR",
    "WRITE_UNTILED",
    "FENCE",
    "POLL_REGMEM",
    "TRAP",
    "TIMESTAMP_GET_GLOBAL",
    "CONSTANT_FILL",
]
STRUCTS: dict[str, list[str]] = {  # member -> structs (with what they nest)
    DISCOVERY: ["binary_header", "ip_discovery_header", "die_header", "ip_v3"],
    UCODE: [
        "common_firmware_header",
        "psp_fw_bin_desc",
        "gfx_firmware_header_v2_0",
        "sdma_firmware_header_v2_0",
        "mes_firmware_header_v1_0",
        "psp_firmware_header_v2_0",
        "imu_firmware_header_v1_0",
        "rlc_firmware_header_v2_0",
        "smc_firmware_header_v1_0",
    ],
    PSP_IF: ["psp_gfx_rb_frame", "psp_gfx_cmd_resp"],
    MQD: ["v11_compute_mqd"],
}
DEFINES: dict[str, list[str]] = {  # member -> #define names (integers)
    DISCOVERY: ["BINARY_SIGNATURE", "DISCOVERY_TABLE_SIGNATURE", "PSP_HEADER_SIZE"],
    DISCOVERY_DRV_H: ["DISCOVERY_TMR_SIZE", "DISCOVERY_TMR_OFFSET"],
    DISCOVERY_DRV_C: ["mmIP_DISCOVERY_VERSION", "mmRCC_CONFIG_MEMSIZE", "mmMP0_SMN_C2PMSG_33"],
    HW_IP: [
        "MP1_HWID",
        "MP0_HWID",
        "GC_HWID",
        "HDP_HWID",
        "SDMA0_HWID",
        "MMHUB_HWID",
        "NBIF_HWID",
        "OSSSYS_HWID",
        "SMUIO_HWID",
        "THM_HWID",
        "UMC_HWID",
        "DF_HWID",
        "ATHUB_HWID",
        "CLKA_HWID",
    ],
    PSP_H: ["PSP_FENCE_BUFFER_SIZE", "PSP_CMD_BUFFER_SIZE", "PSP_1_MEG"],
    PSP_IF: ["PSP_GFX_CMD_BUF_VERSION", "PSP_ERR_UNKNOWN_COMMAND"],
    SMU_MSG: ["PPSMC_MSG_TestMessage", "PPSMC_MSG_GetSmuVersion", "PPSMC_Result_OK"],
    VM_H: [
        "AMDGPU_PTE_VALID",
        "AMDGPU_PTE_SYSTEM",
        "AMDGPU_PTE_SNOOPED",
        "AMDGPU_PTE_TMZ",
        "AMDGPU_PTE_EXECUTABLE",
        "AMDGPU_PTE_READABLE",
        "AMDGPU_PTE_WRITEABLE",
        "AMDGPU_PTE_PRT",
        "AMDGPU_PDE_PTE",
        "AMDGPU_PTE_TF",
        "AMDGPU_PTE_NOALLOC",
        "AMDGPU_MTYPE_NC",
        "AMDGPU_MTYPE_CC",
    ],
    IH_SRC_GFX: [
        "GFX_11_0_0__SRCID__UTCL2_FAULT",
        "GFX_11_0_0__SRCID__SDMA_TRAP",
        "GFX_11_0_0__SRCID__SDMA_QUEUE_HANG",
        "GFX_11_0_0__SRCID__SDMA_PAGE_FAULT",
        "GFX_11_0_0__SRCID__SDMA_POLL_TIMEOUT",
        "GFX_11_0_0__SRCID__CP_EOP_INTERRUPT",
        "GFX_11_0_0__SRCID__CP_BAD_OPCODE_ERROR",
        "GFX_11_0_0__SRCID__CP_PRIV_REG_FAULT",
        "GFX_11_0_0__SRCID__CP_PRIV_INSTR_FAULT",
        "GFX_11_0_0__SRCID__CP_ME_WAIT_REG_MEM_POLL_TIMEOUT",
        "GFX_11_0_0__SRCID__CP_GPF",
        "GFX_11_0_0__SRCID__CP_PM4_PKT_RSVD_BIT_ERROR",
        "GFX_11_0_0__SRCID__SQ_INTERRUPT_ID",
    ],
}
ENUMS: dict[str, list[tuple[str, list[str]]]] = {  # member -> (enum, the members wanted; [] = all)
    PSP_IF: [
        (
            "psp_gfx_crtl_cmd_id",
            ["GFX_CTRL_CMD_ID_INIT_GPCOM_RING", "GFX_CTRL_CMD_ID_DESTROY_RINGS", "GFX_CTRL_CMD_ID_CAN_INIT_RINGS"],
        ),
        ("psp_gfx_cmd_id", ["GFX_CMD_ID_SETUP_TMR", "GFX_CMD_ID_LOAD_IP_FW", "GFX_CMD_ID_AUTOLOAD_RLC"]),
        (
            "psp_gfx_fw_type",
            [
                "GFX_FW_TYPE_CP_MEC",
                "GFX_FW_TYPE_RLC_G",
                "GFX_FW_TYPE_SDMA0",
                "GFX_FW_TYPE_CP_MES",
                "GFX_FW_TYPE_IMU_I",
                "GFX_FW_TYPE_IMU_D",
                "GFX_FW_TYPE_SDMA_UCODE_TH0",
                "GFX_FW_TYPE_SDMA_UCODE_TH1",
                "GFX_FW_TYPE_RS64_MES",
                "GFX_FW_TYPE_RS64_MES_STACK",
                "GFX_FW_TYPE_RS64_PFP",
                "GFX_FW_TYPE_RS64_ME",
                "GFX_FW_TYPE_RS64_MEC",
                "GFX_FW_TYPE_RS64_MEC_P0_STACK",
                "GFX_FW_TYPE_SMU",
            ],
        ),
    ],
    PSP_H: [
        (
            "psp_bootloader_cmd",
            ["PSP_BL__LOAD_SYSDRV", "PSP_BL__LOAD_SOSDRV", "PSP_BL__LOAD_KEY_DATABASE", "PSP_BL__LOAD_TOS_SPL_TABLE"],
        ),
        ("psp_ring_type", ["PSP_RING_TYPE__KM"]),
    ],
    UCODE: [
        (
            "psp_fw_type",
            ["PSP_FW_TYPE_PSP_SOS", "PSP_FW_TYPE_PSP_SYS_DRV", "PSP_FW_TYPE_PSP_KDB", "PSP_FW_TYPE_PSP_SPL"],
        ),
    ],
    DOORBELL_H: [
        (
            "AMDGPU_NAVI10_DOORBELL_ASSIGNMENT",
            [
                "AMDGPU_NAVI10_DOORBELL_KIQ",
                "AMDGPU_NAVI10_DOORBELL_MEC_RING0",
                "AMDGPU_NAVI10_DOORBELL_USERQUEUE_END",
                "AMDGPU_NAVI10_DOORBELL_sDMA_ENGINE0",
                "AMDGPU_NAVI10_DOORBELL_IH",
            ],
        )
    ],
    IH_CLIENT: [
        (
            "soc21_ih_clientid",
            [
                "SOC21_IH_CLIENTID_GFX",
                "SOC21_IH_CLIENTID_GRBM_CP",
                "SOC21_IH_CLIENTID_VMC",
                "SOC21_IH_CLIENTID_MP0",
                "SOC21_IH_CLIENTID_MP1",
            ],
        )
    ],
}
# The IH ring entry (amdgpu_ih.c, amdgpu_ih_decode_iv_helper): field -> (dword, shift, width); 8 dwords per entry.
IH_ENTRY: dict[str, tuple[int, int, int]] = {
    "client_id": (0, 0, 8),
    "src_id": (0, 8, 8),
    "ring_id": (0, 16, 8),
    "vmid": (0, 24, 4),
    "vmid_src": (0, 31, 1),
    "timestamp_lo": (1, 0, 32),
    "timestamp_hi": (2, 0, 16),
    "timestamp_src": (2, 31, 1),
    "pasid": (3, 0, 16),
    "node_id": (3, 16, 8),
    "src_data0": (4, 0, 32),
    "src_data1": (5, 0, 32),
    "src_data2": (6, 0, 32),
    "src_data3": (7, 0, 32),
}
# The ring_id of a CP interrupt entry (gfx_v11_0.c, gfx_v11_0_eop_irq): which compute queue raised it.
CP_RING_ID: dict[str, tuple[int, int, int]] = {"pipe": (0, 0, 2), "me": (0, 2, 2), "queue": (0, 4, 3)}
IP_BASE_BLOCKS = ["GC", "NBIO", "OSSSYS", "MP0", "MP1", "HDP", "MMHUB"]  # sienna_cichlid_ip_offset.h <IP>_BASE__INST0


# ---------------------------------------------------------------------------------------------------- reading
def read_members(source: pathlib.Path, wanted: Iterable[str]) -> tuple[dict[str, bytes], str]:
    """The wanted members (paths below drivers/gpu/drm/amd/) and the kernel version from the top Makefile."""
    wanted = set(wanted)
    found: dict[str, bytes] = {}
    version = ""
    with tarfile.open(source) as tar:
        for member in tar:
            name = member.name.split("/", 1)[1] if "/" in member.name else member.name
            if name == "Makefile":
                fobj = tar.extractfile(member)
                assert fobj is not None
                head = fobj.read(400).decode()
                parts = [re.search(rf"^{k} = (\S+)", head, re.M) for k in ("VERSION", "PATCHLEVEL", "SUBLEVEL")]
                version = ".".join(p.group(1) for p in parts if p)
            if name.startswith(AMD) and name[len(AMD) :] in wanted:
                fobj = tar.extractfile(member)
                assert fobj is not None
                found[name[len(AMD) :]] = fobj.read()
                if len(found) == len(wanted) and version:
                    break
    missing = sorted(wanted - set(found))
    if missing:
        sys.exit(f"{source}: members not found: {', '.join(missing)}")
    return found, version


def debian_version() -> str:
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", PACKAGE], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (dpkg-query unavailable)"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown (package not installed)"


# ---------------------------------------------------------------------------------------------------- C parsing
def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", lambda m: " " * 0 + "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def defines(text: str) -> dict[str, str]:
    """#define NAME value (object-like and function-like, continuation lines joined) -> the raw value text."""
    out: dict[str, str] = {}
    joined = strip_comments(text).replace("\\\n", " ")
    for m in re.finditer(r"^\s*#\s*define\s+(\w+(?:\([^)]*\))?)[ \t]*(.*)$", joined, re.M):
        out[m.group(1)] = m.group(2).strip()
    return out


def c_int(expr: str, known: dict[str, int] | None = None) -> int:
    """Evaluate an integer C constant expression (literals with suffixes, + - * << >> | & ~, parentheses, casts)."""
    expr = re.sub(r"\(\s*(?:uint64_t|uint32_t|u64|u32|int)\s*\)", "", expr)
    expr = re.sub(r"\b(0[xX][0-9a-fA-F]+|\d+)(?:ULL|UL|LL|U|L)\b", r"\1", expr)
    if known:
        expr = re.sub(
            r"\b[A-Za-z_]\w*\b", lambda m: str(known[m.group(0)]) if m.group(0) in known else m.group(0), expr
        )
    if not expr.strip() or not re.fullmatch(r"[\s0-9a-fA-FxX+\-*/()<>|&~]*", expr):
        raise ValueError(f"not an integer constant expression: {expr!r}")
    try:
        return int(eval(expr.replace("/", "//"), {"__builtins__": {}}))  # digits and operators only (checked above)
    except SyntaxError:
        raise ValueError(f"not an integer constant expression: {expr!r}") from None


def macro_shift(raw: str) -> tuple[int, int | None]:
    """(shift, mask or None) of a field macro: ((x) << N), (((x) & M) << N), (1 << N), (((h) >> N) & M)."""
    raw = raw.replace(" ", "")
    if m := re.fullmatch(r"\(\(\w\)<<(\w+)\)", raw):
        return c_int(m.group(1)), None
    if m := re.fullmatch(r"\(\(\(\w\)&(\w+)\)<<(\w+)\)", raw):
        return c_int(m.group(2)), c_int(m.group(1))
    if m := re.fullmatch(r"\((\w+)<<(\w+)\)", raw):
        value = c_int(m.group(1))
        return c_int(m.group(2)), value if value != 1 else 1
    if m := re.fullmatch(r"\(\(\(\w\)>>(\w+)\)&(\w+)\)", raw):
        return c_int(m.group(1)), c_int(m.group(2))
    raise ValueError(f"unrecognised field macro {raw!r}")


def enum_members(body: str, known: dict[str, int] | None = None) -> dict[str, int]:
    """The members of an enum body `A = 1, B, C = A + 4`, implicit values filled in."""
    out: dict[str, int] = {}
    value = -1
    for item in body.split(","):
        item = item.strip()
        if not item or item.startswith("#"):
            continue
        if "=" in item:
            key, expr = (s.strip() for s in item.split("=", 1))
            value = out[expr] if expr in out else c_int(expr, {**(known or {}), **out})
        else:
            key, value = item, value + 1
        out[key] = value
    return out


def enum_values(text: str, name: str) -> dict[str, int]:
    """The members of `enum name { ... }` / `typedef enum name { ... }`."""
    body = re.search(rf"enum\s+{re.escape(name)}\s*\{{(.*?)\}}", strip_comments(text), re.S)
    if body is None:
        raise ValueError(f"enum {name} not found")
    return enum_members(body.group(1))


def preprocess_endianness(text: str) -> str:
    """Keep the little-endian branch of #if/#else blocks that test the byte order; drop other directives."""
    out: list[str] = []
    stack: list[tuple[bool, bool]] = []  # (this branch kept, some branch of the block taken)
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("#if"):
            keep = "BIG" not in s.upper()
            stack.append((keep, keep))
        elif s.startswith("#elif"):
            keep = not stack[-1][1] and "BIG" not in s.upper()
            stack[-1] = (keep, stack[-1][1] or keep)
        elif s.startswith("#else"):
            stack[-1] = (not stack[-1][1], True)
        elif s.startswith("#endif"):
            stack.pop()
        elif s.startswith("#pragma pack"):
            out.append(s)
        elif not s.startswith("#") and all(kept for kept, _ in stack):
            out.append(line)
    return "\n".join(out)


SCALARS = {"uint8_t": "B", "uint16_t": "H", "uint32_t": "I", "uint64_t": "Q", "int32_t": "I", "u32": "I"}
SIZES = {"B": 1, "H": 2, "I": 4, "Q": 8}


@dataclass
class CStruct:
    name: str
    size: int
    members: list[tuple[str, int, str, int, int, int]] = field(default_factory=list)  # name, off, kind, cnt, sh, w
    align: int = 1
    union: bool = False


class StructParser:
    """A parser for the plain structs of the amdgpu headers: fixed-width integers, enums (4 bytes), nested and
    anonymous structs and unions, arrays with constant (sizeof) expressions, bitfields, flexible arrays."""

    def __init__(self, text: str, consts: dict[str, int]) -> None:
        self.text = preprocess_endianness(strip_comments(text))
        self.consts = consts
        self.done: dict[str, CStruct] = {}

    def body(self, keyword: str, name: str) -> tuple[str, int]:
        m = re.search(rf"\b{keyword}\s+{re.escape(name)}\s*\{{", self.text)
        if m is None:
            raise ValueError(f"{keyword} {name} not found")
        pack = (
            1
            if self.text.rfind("#pragma pack(1)", 0, m.start()) > self.text.rfind("#pragma pack()", 0, m.start())
            else 0
        )
        return self._braced(m.end() - 1), pack

    def _braced(self, start: int) -> str:
        depth = 0
        for i in range(start, len(self.text)):
            depth += {"{": 1, "}": -1}.get(self.text[i], 0)
            if depth == 0:
                return self.text[start + 1 : i]
        raise ValueError("unbalanced braces")

    def get(self, keyword: str, name: str) -> CStruct:
        key = f"{keyword} {name}"
        if key not in self.done:
            body, pack = self.body(keyword, name)
            self.done[key] = self.layout(name, body, keyword == "union", pack)
        return self.done[key]

    def split(self, body: str) -> list[str]:
        """Top-level declarations of a struct body (nested braces kept together)."""
        decls, depth, cur = [], 0, ""
        for ch in body:
            cur += ch
            depth += {"{": 1, "}": -1}.get(ch, 0)
            if ch == ";" and depth == 0:
                decls.append(cur.strip().rstrip(";").strip())
                cur = ""
        return [d for d in decls if d]

    def layout(self, name: str, body: str, union: bool, pack: int) -> CStruct:
        out = CStruct(name, 0, union=union)
        off = 0
        bit_unit: tuple[int, str, int] | None = None  # (offset, kind, bits used) of an open bitfield unit
        for decl in self.split(body):
            decl = re.sub(r"\b__packed\b|\b__attribute__\s*\(\(.*?\)\)", "", decl).strip()
            if m := re.fullmatch(r"DECLARE_FLEX_ARRAY\((\w+),\s*(\w+)\)", decl):
                decl = f"{m.group(1)} {m.group(2)}[]"
            if m := re.fullmatch(r"(struct|union)\s*(\w*)\s*\{(.*)\}\s*(\w*)", decl, re.S):  # nested definition
                # an anonymous type gets the name outer__member (no C name to check it against)
                anon = f"{name}__{m.group(4) or m.group(1)}"
                inner = self.layout(m.group(2) or anon, m.group(3), m.group(1) == "union", pack)
                members = [(m.group(4), inner)] if m.group(4) else None
                align = 1 if pack else inner.align
                off = -(-off // align) * align if not union else 0
                if members is None:  # anonymous: its members join ours
                    out.members += [(n, off + o, k, c, s, w) for n, o, k, c, s, w in inner.members]
                else:
                    self.done[f"struct {inner.name}"] = inner
                    out.members.append((m.group(4), off, f"@{inner.name}", 1, 0, 0))
                out.align = max(out.align, align)
                out.size = max(out.size, off + inner.size)
                off = 0 if union else off + inner.size
                bit_unit = None
                continue
            m = re.fullmatch(r"(?:(struct|union|enum)\s+)?(\w+)\s+(\w+)\s*(\[[^\]]*\])?\s*(?::\s*(\d+))?", decl)
            if m is None:
                raise ValueError(f"{name}: cannot parse member {decl!r}")
            keyword, ctype, member, dim, bits = m.groups()
            if keyword in ("struct", "union"):
                inner = self.get(keyword, ctype)
                kind, size, align = f"@{ctype}", inner.size, 1 if pack else inner.align
            elif keyword == "enum":
                kind, size, align = "I", 4, 1 if pack else 4
            elif ctype in SCALARS:
                kind = SCALARS[ctype]
                size = SIZES[kind]
                align = 1 if pack else size
            else:  # a typedef'd struct used by its bare name
                inner = self.get("struct", ctype)
                kind, size, align = f"@{ctype}", inner.size, 1 if pack else inner.align
            if dim is None:
                count = 1
            elif dim == "[]":
                count = 0
            else:
                count = self.array_len(dim[1:-1])
            if bits is not None:
                width = int(bits)
                if bit_unit is None or bit_unit[1] != kind or bit_unit[2] + width > 8 * size:
                    off = -(-off // align) * align if not union else 0
                    bit_unit = (off, kind, 0)
                    off = off + size if not union else 0
                out.members.append((member, bit_unit[0], kind, 1, bit_unit[2], width))
                bit_unit = (bit_unit[0], kind, bit_unit[2] + width)
                out.size = max(out.size, bit_unit[0] + size)
                out.align = max(out.align, align)
                continue
            bit_unit = None
            start = 0 if union else -(-off // align) * align
            out.members.append((member, start, kind, count, 0, 0))
            out.size = max(out.size, start + size * count)
            out.align = max(out.align, align)
            if not union:
                off = start + size * count
        out.size = -(-out.size // out.align) * out.align
        return out

    def array_len(self, expr: str) -> int:
        def size_of(m: re.Match[str]) -> str:
            return str(self.get(m.group(1), m.group(2)).size)

        expr = re.sub(r"sizeof\s*\(\s*(struct|union)\s+(\w+)\s*\)", size_of, expr)
        return c_int(expr, self.consts)


# ---------------------------------------------------------------------------------------------------- emitting
class Lit(str):
    """Source text emitted as is."""


def render(value: object, indent: int, lead: int = 0, width: int = 120) -> str:
    """`value` as Python source in ruff's format for a line indented by `indent` on which `lead` characters precede
    it: on one line if it fits, else its elements on the next line, else one element per line."""
    flat = _flat(value)
    if indent + lead + len(flat) <= width:
        return flat
    pad = " " * (indent + 4)
    if isinstance(value, dict):
        items = [f"{pad}{_flat(k)}: {render(v, indent + 4, len(_flat(k)) + 2, width)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + ",\n" + " " * indent + "}"
    if isinstance(value, Call):
        inner = ", ".join(_flat(a) for a in value.args)
        if indent + 4 + len(inner) <= width:
            return f"{value.func}(\n{pad}{inner}\n" + " " * indent + ")"
        items = [pad + render(a, indent + 4, 0, width) for a in value.args]
        return f"{value.func}(\n" + ",\n".join(items) + ",\n" + " " * indent + ")"
    if isinstance(value, list | tuple):
        open_, close = ("[", "]") if isinstance(value, list) else ("(", ")")
        inner = ", ".join(_flat(a) for a in value)
        if indent + 4 + len(inner) <= width:
            return f"{open_}\n{pad}{inner}\n" + " " * indent + close
        items = [pad + render(a, indent + 4, 0, width) for a in value]
        return open_ + "\n" + ",\n".join(items) + ",\n" + " " * indent + close
    raise ValueError(f"cannot split {flat[:60]}... over lines")


@dataclass
class Call:
    func: str
    args: list[object]


def _flat(value: object) -> str:
    if isinstance(value, Lit):
        return str(value)
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        return f"0x{value:X}" if value > 9 else str(value)
    if isinstance(value, str):
        return '"' + value + '"'
    if isinstance(value, tuple):
        inner = ", ".join(_flat(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        return "[" + ", ".join(_flat(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_flat(k)}: {_flat(v)}" for k, v in value.items()) + "}"
    if isinstance(value, Call):
        return f"{value.func}(" + ", ".join(_flat(a) for a in value.args) + ")"
    raise TypeError(type(value))


def assign(name: str, value: object, indent: int = 4) -> str:
    return " " * indent + f"{name} = " + render(value, indent, len(name) + 3)


# ---------------------------------------------------------------------------------------------------- building
def field_width(mask: int, shift: int) -> int:
    width = (mask >> shift).bit_length()
    if mask != ((1 << width) - 1) << shift:
        raise ValueError(f"mask {mask:#x} is not contiguous from bit {shift}")
    return width


def build_registers(src: dict[str, bytes]) -> list[str]:
    lines: list[str] = []
    for ip, (off_h, mask_h, default_h) in REG_HEADERS.items():
        offs = defines(src[off_h].decode())
        masks = defines(src[mask_h].decode())
        defaults = defines(src[default_h].decode()) if default_h else {}
        lines += [
            "",
            "",
            f"class {ip}:",
            f'    """{ip} registers ({off_h.rsplit("/", 1)[1]}, '
            f'{mask_h.rsplit("/", 1)[1]}{", " + default_h.rsplit("/", 1)[1] if default_h else ""})."""',
            "",
        ]
        for name in REGISTERS[ip]:
            if f"reg{name}" not in offs:
                sys.exit(f"{off_h}: no register {name}")
            offset, base_idx = c_int(offs[f"reg{name}"]), c_int(offs[f"reg{name}_BASE_IDX"])
            default = c_int(defaults[f"reg{name}_DEFAULT"]) if f"reg{name}_DEFAULT" in defaults else 0
            fields: dict[str, tuple[int, int]] = {}
            prefix = f"{name}__"
            for key, raw in masks.items():
                if key.startswith(prefix) and key.endswith("__SHIFT"):
                    fname = key[len(prefix) : -len("__SHIFT")]
                    shift, mask = c_int(raw), c_int(masks[f"{prefix}{fname}_MASK"])
                    fields[fname] = (shift, field_width(mask, shift))
            fields = dict(sorted(fields.items(), key=lambda kv: kv[1][0]))
            block = name.split("_", 1)[0] if ip == "MP" else ip  # MP0_* and MP1_* registers use their own bases
            lines.append(assign(name, Call("Reg", [block, name, offset, base_idx, default, fields])))
    return lines


def build_pm4(src: dict[str, bytes]) -> list[str]:
    d = defines(src[NVD].decode())
    lines = ["", "", "class PM4:", '    """PM4 type-3 opcodes and constants (nvd.h)."""', ""]
    for op in PM4_OPCODES:
        lines.append(f"    {op} = {_flat(c_int(d['PACKET3_' + op]))}")
    for name in PM4_DEFINES:
        lines.append(f"    {name.removeprefix('PACKET3_')} = {_flat(c_int(d[name]))}")
    for group, (macro, values) in PM4_VALUES.items():
        if not any(k.startswith(macro + "(") for k in d):
            sys.exit(f"nvd.h: no macro {macro}")
        for key, value in values.items():
            lines.append(f"    {group}_{key} = {value}")
    shifts: dict[str, tuple[int, int | None]] = {}
    for key, raw in d.items():
        name = key.split("(", 1)[0]
        try:
            shifts[name] = macro_shift(raw)
        except ValueError:
            continue
    lines += [
        "",
        "",
        "class PM4_PACKETS:",
        '    """PM4 packet layouts: {field: (dword from the header, shift, width)}."""',
        "",
    ]
    for pkt, (ndw, spec) in PM4_PACKETS.items():
        resolved: dict[str, tuple[int, int, int | None]] = {}
        for fname, (dword, where, width) in spec.items():
            if isinstance(where, int):
                resolved[fname] = (dword, where, width)
                continue
            if where not in shifts:
                sys.exit(f"nvd.h: no field macro {where}")
            shift, mask = shifts[where]
            if mask is not None and shift is not None and width is None:
                width = mask.bit_length() if mask != 1 else 1
            resolved[fname] = (dword, shift, width)
        out: dict[str, tuple[int, int, int]] = {}
        for fname, (dword, shift, width) in resolved.items():
            if width is None:  # up to the next field of the dword (or the dword's top)
                later = [s for dw, s, _ in resolved.values() if dw == dword and s > shift]
                width = (min(later) if later else 32) - shift
            out[fname] = (dword, shift, width)
        lines.append(assign(pkt, Call("Packet", [pkt, ndw, out])))
    enum = enum_values(src[SOC21_ENUM].decode(), "VGT_EVENT_TYPE")
    lines += [
        "",
        "",
        "class EVENT:",
        '    """VGT_EVENT_TYPE values (soc21_enum.h) for RELEASE_MEM / EVENT_WRITE."""',
        "",
    ]
    lines += [f"    {e} = {_flat(enum[e])}" for e in EVENT_TYPES]
    return lines


def build_sdma(src: dict[str, bytes]) -> list[str]:
    d = defines(src[SDMA_PKT].decode())
    lines = ["", "", "class SDMA:", '    """SDMA 6.0 opcodes and sub-opcodes (sdma_v6_0_0_pkt_open.h)."""', ""]
    lines += [f"    OP_{op} = {_flat(c_int(d['SDMA_OP_' + op]))}" for op in SDMA_OPS]
    lines += [f"    SUBOP_{op} = {_flat(c_int(d['SDMA_SUBOP_' + op]))}" for op in SDMA_SUBOPS]
    all_packets = {k[len("SDMA_PKT_") : -len("_HEADER_op_offset")] for k in d if k.endswith("_HEADER_op_offset")}
    lines += ["", "", "class SDMA_PACKETS:", '    """SDMA 6.0 packet layouts: {field: (dword, shift, width)}."""', ""]
    for pkt in SDMA_PACKETS:
        fields: dict[str, tuple[int, int, int]] = {}
        for key, raw in d.items():
            m = re.fullmatch(rf"SDMA_PKT_{pkt}_([A-Z0-9_]+?)_([a-z][a-z0-9_]*)_offset", key)
            if m is None:
                continue
            longer = [
                p for p in all_packets if p != pkt and p.startswith(pkt + "_") and key.startswith(f"SDMA_PKT_{p}_")
            ]
            if longer:
                continue
            base = key[: -len("_offset")]
            shift, mask = c_int(d[base + "_shift"]), c_int(d[base + "_mask"])
            if m.group(2) in fields:
                sys.exit(f"{SDMA_PKT}: field {m.group(2)} twice in {pkt}")
            fields[m.group(2)] = (c_int(raw), shift, field_width(mask << shift, shift))
        if not fields:
            sys.exit(f"{SDMA_PKT}: no packet {pkt}")
        ndw = max(dw for dw, _, _ in fields.values()) + 1
        lines.append(assign(pkt, Call("Packet", [pkt, ndw, fields])))
    return lines


def build_structs(src: dict[str, bytes]) -> list[str]:
    lines = [
        "",
        "",
        "class STRUCTS:",
        '    """Packed C structures (discovery.h, amdgpu_ucode.h, psp_gfx_if.h, v11_structs.h)."""',
    ]
    for member, names in STRUCTS.items():
        text = src[member].decode()
        consts: dict[str, int] = {}
        for enum in re.findall(r"enum\s+(\w*)\s*\{", strip_comments(text)):
            if enum:
                consts.update(enum_values(text, enum))
        consts.update(enum_values_anonymous(text))
        for key, raw in defines(text).items():
            try:
                consts.setdefault(key, c_int(raw))
            except ValueError:
                pass
        parser = StructParser(text, consts)
        emitted: set[str] = set()
        for name in names:
            emit_struct(parser, parser.get("struct", name), emitted, lines)
    return lines


def emit_struct(parser: StructParser, cs: CStruct, emitted: set[str], lines: list[str]) -> None:
    """Append `cs` (after the structures it nests) to `lines`, once."""
    if cs.name in emitted:
        return
    for _, _, kind, _, _, _ in cs.members:
        if kind.startswith("@"):
            inner = parser.done.get(f"struct {kind[1:]}") or parser.done[f"union {kind[1:]}"]
            emit_struct(parser, inner, emitted, lines)
    emitted.add(cs.name)
    members = {n: (o, Lit(k[1:]) if k.startswith("@") else k, c, s, w) for n, o, k, c, s, w in cs.members}
    lines.append("")
    args = [cs.name, cs.size, members] + ([Lit("union=True")] if cs.union else [])
    lines.append(assign(cs.name, Call("Struct", args)))


def enum_values_anonymous(text: str) -> dict[str, int]:
    """Members of `typedef enum { ... } name;` (discovery.h's table ids)."""
    out: dict[str, int] = {}
    for body in re.findall(r"typedef\s+enum\s*\{(.*?)\}", strip_comments(text), re.S):
        out.update(enum_members(body, out))
    return out


def build_constants(src: dict[str, bytes]) -> list[str]:
    lines = [
        "",
        "",
        "class CONST:",
        '    """Integer constants (#define and enum members) named as in the headers."""',
        "",
    ]
    for member, names in DEFINES.items():
        d = defines(src[member].decode())
        for name in names:
            if name not in d:
                sys.exit(f"{member}: no #define {name}")
            lines.append(f"    {name} = {_flat(c_int(d[name]))}")
    for member, enums in ENUMS.items():
        text = src[member].decode()
        for enum, wanted in enums:
            values = enum_values(text, enum)
            for name in wanted:
                if name not in values:
                    sys.exit(f"{member}: enum {enum} has no {name}")
                lines.append(f"    {name} = {_flat(values[name])}")
    table = enum_values_anonymous(src[DISCOVERY].decode())
    lines += [f"    TABLE_{k} = {v}" for k, v in table.items() if k in ("IP_DISCOVERY", "GC", "TOTAL_TABLES")]
    lines += ["", "", assign("IH_ENTRY", Call("Packet", ["IH_ENTRY", 8, IH_ENTRY]), 0)]
    lines.append(assign("CP_RING_ID", Call("Packet", ["CP_RING_ID", 1, CP_RING_ID]), 0))
    body = re.search(r"gfxhub_client_ids\[\]\s*=\s*\{(.*?)\}", strip_comments(src[GFXHUB_C].decode()), re.S)
    if body is None:
        sys.exit(f"{GFXHUB_C}: no gfxhub_client_ids")
    lines += ["# GCVM_L2_PROTECTION_FAULT_STATUS.CID -> the GFX hub client (gfxhub_v3_0.c gfxhub_client_ids)."]
    lines.append(assign("GFXHUB_CLIENT_IDS", re.findall(r'"([^"]*)"', body.group(1)), 0))
    hwids = {k: v for k, v in defines(src[HW_IP].decode()).items() if k.endswith("_HWID")}
    hwip = dict(re.findall(r"\[(\w+)_HWIP\]\s*=\s*(\w+_HWID)", strip_comments(src[DISCOVERY_DRV_C].decode())))
    lines += ["# IP block -> hardware id in the discovery table (amdgpu_discovery.c hw_id_map, soc15_hw_ip.h)."]
    lines.append(assign("IP_HWID", {ip: c_int(hwids[hwip[ip]]) for ip in IP_BASE_BLOCKS + ["SDMA0"]}, 0))
    d = defines(src[IP_OFFSET].decode())
    bases = {ip: [c_int(d[f"{ip}_BASE__INST0_SEG{i}"]) for i in range(5)] for ip in IP_BASE_BLOCKS}
    lines += [
        "# Base segments the simulated card reports through IP discovery: the Navi 21 values of",
        f"# {IP_OFFSET}",
        "# (a real card reports its own, which the driver reads from its discovery table).",
    ]
    lines.append(assign("SIM_IP_BASES", {ip: tuple(v) for ip, v in bases.items()}, 0))
    return lines


def all_members() -> set[str]:
    """Every member the tables come from (paths below drivers/gpu/drm/amd/)."""
    members = {m for triple in REG_HEADERS.values() for m in triple if m}
    members |= {
        NVD,
        SDMA_PKT,
        SOC21_ENUM,
        DISCOVERY,
        DISCOVERY_DRV_H,
        DISCOVERY_DRV_C,
        HW_IP,
        UCODE,
        PSP_IF,
        MQD,
        VM_H,
        DOORBELL_H,
        IH_CLIENT,
        IH_SRC_GFX,
        IP_OFFSET,
        GFXHUB_C,
        PSP_H,
        SMU_MSG,
    }
    return members


def generate(source: pathlib.Path, members: tuple[dict[str, bytes], str] | None = None) -> str:
    """The table module from `source` (`members`: what read_members already returned for it)."""
    src, kernel = members or read_members(source, all_members())
    header = [
        '"""GENERATED by packages/usbgpu/tools/gen_amd_tables.py from the amdgpu headers of Linux: do not edit.',
        "",
        f"Source package: {PACKAGE} {debian_version()} (kernel {kernel}), {source}",
        "Regenerate: python3 packages/usbgpu/tools/gen_amd_tables.py [--source TARBALL]",
        "Members (below drivers/gpu/drm/amd/) and their sha256:",
    ]
    header += [f"    {m} {hashlib.sha256(src[m]).hexdigest()}" for m in sorted(src)]
    header += [
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "from speck.usbgpu.amd.regdefs import Packet, Reg, Struct",
    ]
    body = build_registers(src) + build_pm4(src) + build_sdma(src) + build_structs(src) + build_constants(src)
    return "\n".join(header + body) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=pathlib.Path, default=DEFAULT_SOURCE)
    parser.add_argument("--out", type=pathlib.Path, default=OUT)
    parser.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    args = parser.parse_args()
    if not args.source.exists():
        sys.exit(f"{args.source} not found: install Debian's {PACKAGE} (apt-get install {PACKAGE}) or pass --source")
    text = generate(args.source)
    if args.check:
        same = args.out.exists() and args.out.read_text() == text
        print(f"{args.out}: {'up to date' if same else 'DIFFERS from what the source generates'}")
        sys.exit(0 if same else 1)
    args.out.write_text(text)
    print(f"wrote {args.out} ({text.count(chr(10))} lines)")


if __name__ == "__main__":
    main()
