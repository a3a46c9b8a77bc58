"""The structures, #defines, enum members and ring-entry layouts speck uses, by the header they come from."""

from __future__ import annotations

from amdgen.headers import (
    DISCOVERY,
    DISCOVERY_DRV_C,
    DISCOVERY_DRV_H,
    DOORBELL_H,
    HW_IP,
    IH_CLIENT,
    IH_SRC_GFX,
    MQD,
    PSP_H,
    PSP_IF,
    SMU_MSG,
    UCODE,
    VM_H,
)

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
