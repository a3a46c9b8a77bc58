"""The kernel source package and the members of it (paths below drivers/gpu/drm/amd/) the tables are read from."""

from __future__ import annotations

import pathlib

DEFAULT_SOURCE = pathlib.Path("/usr/src/linux-source-6.12.tar.xz")
PACKAGE = "linux-source-6.12"
AMD = "drivers/gpu/drm/amd/"

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
