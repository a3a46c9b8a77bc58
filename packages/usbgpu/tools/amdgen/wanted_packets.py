"""The PM4 and SDMA opcodes, packets and field values speck uses; what the headers give only in comments or C code
is transcribed here, each naming where it comes from."""

from __future__ import annotations

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
