-- altmark.lua: a Wireshark / tshark dissector for the RFC 9343 AltMark option (IPv6 Alternate
-- Marking), which Wireshark 4.0 shows only as an unknown IPv6 option.
--
--   tshark -r FILE -X lua_script:examples/wireshark/altmark.lua -Y altmark
--   tshark ... -T fields -e altmark.flowmon_id -e altmark.l -e altmark.d -e altmark.header
--   Wireshark: copy this file to the personal Lua plugins directory (Help > About Wireshark >
--   Folders > Personal Lua Plugins, e.g. ~/.local/lib/wireshark/plugins/) and restart.
--
-- The option (type 0x12, Opt Data Len 4) sits in a Hop-by-Hop (0) or Destination Options (60)
-- header; its 4 data bytes are, big-endian:
--
--    0                   1                   2                   3
--    0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
--   +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
--   |              FlowMonID                |L|D|     Reserved      |
--   +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
--
-- It is a postdissector: after the IPv6 dissector has run, it walks each IPv6 header's
-- extension header chain itself (Hop-by-Hop, Destination Options, Routing, Fragment, AH; at
-- most 16 headers), and every option TLV of the Hop-by-Hop and Destination Options headers.
-- Every read is checked against the captured bytes and against the IPv6 payload length;
-- what does not fit is reported as expert info (altmark.malformed, altmark.truncated), never a
-- Lua error. An altmark tree appears for every option of type 0x12 found.
--
-- Fields:
--   altmark             the option is present (one tree per option)
--   altmark.header      0 (Hop-by-Hop Options) or 60 (Destination Options): the header holding it
--   altmark.nh          that header's Next Header (what follows it: 6 TCP, 17 UDP, 58 ICMPv6, ...)
--   altmark.hdr_len     that header's length in bytes ((Hdr Ext Len + 1) * 8)
--   altmark.type        the option type (0x12)
--   altmark.len         Opt Data Len (4)
--   altmark.data        the 4 data bytes as one 32-bit word
--   altmark.flowmon_id  FlowMonID (20 bits)
--   altmark.l           L: the loss flag, the packet's color (flowplane: the period's color)
--   altmark.d           D: the delay flag (flowplane: double marking)
--   altmark.reserved    the 10 reserved bits (0 on transmission)
--
-- The dscp and ipv4-flag carriers need no dissector: their marks are ordinary IP header fields
-- (ip.dsfield.dscp / ipv6.tclass.dscp for dscp, ip.flags.rb for ipv4-flag); docs/altmark.md,
-- "Capturing marked packets", lists them.

local ALTMARK_TYPE = 0x12
local ALTMARK_LEN = 4
local MAX_EXT = 16 -- extension headers walked per IPv6 header before giving up
local MAX_OPTS = 64 -- option TLVs walked per options header before giving up

local NH_HBH, NH_ROUTING, NH_FRAGMENT, NH_AH, NH_DEST = 0, 43, 44, 51, 60

local altmark = Proto("altmark", "IPv6 Alternate Marking (RFC 9343 AltMark option)")

local header_names = { [NH_HBH] = "Hop-by-Hop Options", [NH_DEST] = "Destination Options" }
local nh_names = {
	[0] = "Hop-by-Hop Options", [4] = "IPv4", [6] = "TCP", [17] = "UDP", [41] = "IPv6",
	[43] = "Routing", [44] = "Fragment", [47] = "GRE", [50] = "ESP", [51] = "AH",
	[58] = "ICMPv6", [59] = "No Next Header", [60] = "Destination Options", [132] = "SCTP",
	[136] = "UDP-Lite",
}

local f = altmark.fields
f.header = ProtoField.uint8("altmark.header", "Options header", base.DEC, header_names)
f.nh = ProtoField.uint8("altmark.nh", "Next Header (of the options header)", base.DEC, nh_names)
f.hdr_len = ProtoField.uint16("altmark.hdr_len", "Options header length", base.DEC)
f.type = ProtoField.uint8("altmark.type", "Option Type", base.HEX)
f.len = ProtoField.uint8("altmark.len", "Opt Data Len", base.DEC)
f.data = ProtoField.uint32("altmark.data", "Data", base.HEX)
f.flowmon_id = ProtoField.uint32("altmark.flowmon_id", "FlowMonID", base.DEC, nil, 0xFFFFF000)
f.l = ProtoField.bool("altmark.l", "L (loss flag, color)", 32, nil, 0x00000800)
f.d = ProtoField.bool("altmark.d", "D (delay flag)", 32, nil, 0x00000400)
f.reserved = ProtoField.uint32("altmark.reserved", "Reserved", base.HEX, nil, 0x000003FF)

local e_malformed = ProtoExpert.new("altmark.malformed", "Malformed AltMark option or options header",
	expert.group.MALFORMED, expert.severity.ERROR)
local e_truncated = ProtoExpert.new("altmark.truncated", "Capture ends inside the AltMark option",
	expert.group.MALFORMED, expert.severity.WARN)
local e_reserved = ProtoExpert.new("altmark.reserved_set", "Reserved bits are not zero",
	expert.group.PROTOCOL, expert.severity.WARN)
altmark.experts = { e_malformed, e_truncated, e_reserved }

local ipv6_field = Field.new("ipv6")

-- add_option adds the tree of one AltMark option at off (its type byte) in the options header
-- at hdr (type ext, hl bytes long, ending at hend). cap is the end of the captured bytes.
-- Problems become expert info on the option's tree. Returns false when the option is malformed
-- (the bytes after it cannot be trusted to be options), true otherwise.
local function add_option(tree, pinfo, tvb, ext, hdr, hl, hend, off, cap)
	local avail = math.min(hend, cap) - off -- option bytes in this header and in the capture
	local t = tree:add(altmark, tvb(off, math.max(1, math.min(avail, 2 + ALTMARK_LEN))))
	t:add(f.header, ext):set_generated()
	t:add(f.nh, tvb(hdr, 1))
	t:add(f.hdr_len, hl):set_generated()
	t:add(f.type, tvb(off, 1))
	if avail < 2 then
		if hend - off < 2 then
			t:add_proto_expert_info(e_malformed, string.format(
				"option type at the last byte of its %s header: no room for its length", header_names[ext]))
			t:append_text(" [malformed: overruns its header]")
			return false
		end
		t:add_proto_expert_info(e_truncated, "capture ends after the option type")
		return true
	end
	local olen = tvb(off + 1, 1):uint()
	local litem = t:add(f.len, tvb(off + 1, 1))
	if olen ~= ALTMARK_LEN then
		litem:add_proto_expert_info(e_malformed,
			string.format("Opt Data Len %d; RFC 9343 defines 4: FlowMonID, L, D, Reserved not decoded", olen))
		t:append_text(" [malformed: Opt Data Len " .. olen .. "]")
		return false
	end
	if off + 2 + ALTMARK_LEN > hend then
		t:add_proto_expert_info(e_malformed, string.format(
			"option overruns its %s header (%d bytes from the option to the header's end, need 6)",
			header_names[ext], hend - off))
		t:append_text(" [malformed: overruns its header]")
		return false
	end
	if off + 2 + ALTMARK_LEN > cap then
		t:add_proto_expert_info(e_truncated,
			string.format("capture ends %d bytes into the option's 4 data bytes", math.max(0, cap - off - 2)))
		t:append_text(" [truncated]")
		return true
	end
	local r = tvb(off + 2, ALTMARK_LEN)
	local w = r:uint()
	t:add(f.data, r)
	t:add(f.flowmon_id, r)
	t:add(f.l, r)
	t:add(f.d, r)
	local ritem = t:add(f.reserved, r)
	-- arithmetic rather than bit32, which not every Lua that Wireshark builds with has
	if w % 1024 ~= 0 then
		ritem:add_proto_expert_info(e_reserved)
	end
	local id = math.floor(w / 4096)
	local l = math.floor(w / 2048) % 2
	local d = math.floor(w / 1024) % 2
	local s = string.format("FlowMonID %d, L %d, D %d", id, l, d)
	t:append_text(string.format(", %s, in %s", s, header_names[ext]))
	pinfo.cols.info:append(" [AltMark " .. s .. "]")
	return true
end

-- walk_options walks the option TLVs of the options header at hdr (hl bytes, ending at hend).
-- Returns false when it had to stop at a malformed TLV (reported), true otherwise.
local function walk_options(tree, pinfo, tvb, ext, hdr, hl, hend, cap, report)
	local off = hdr + 2
	for _ = 1, MAX_OPTS do
		if off >= hend then
			return true
		end
		if off >= cap then
			return true -- the capture ends here; nothing more to see
		end
		local otype = tvb(off, 1):uint()
		if otype == ALTMARK_TYPE and not add_option(tree, pinfo, tvb, ext, hdr, hl, hend, off, cap) then
			return false -- reported by add_option
		end
		if otype == 0 then -- Pad1
			off = off + 1
		else
			if off + 2 > hend then
				if otype == ALTMARK_TYPE then
					return false -- reported by add_option
				end
				report(off, 1, string.format(
					"option 0x%02x at %s header byte %d has no length byte", otype, header_names[ext], off - hdr))
				return false
			end
			if off + 2 > cap then
				return true
			end
			local olen = tvb(off + 1, 1):uint()
			if off + 2 + olen > hend then
				if otype ~= ALTMARK_TYPE then
					report(off, 2, string.format(
						"option 0x%02x (length %d) at %s header byte %d overruns the header (%d bytes)",
						otype, olen, header_names[ext], off - hdr, hl))
				end
				return false
			end
			off = off + 2 + olen
		end
	end
	report(hdr, 2, string.format("more than %d options in one %s header: not looked at further",
		MAX_OPTS, header_names[ext]))
	return false
end

-- dissect_ipv6 walks the extension headers of the IPv6 header at base in tvb.
local function dissect_ipv6(tvb, pinfo, tree, base)
	local cap = tvb:len()
	if base + 40 > cap then
		return
	end
	local nh = tvb(base + 6, 1):uint()
	local plen = tvb(base + 4, 2):uint()
	local limit = base + 40 + plen
	if plen == 0 then
		limit = tvb:reported_len() -- a jumbogram (RFC 2675): the Hop-by-Hop option has the length
	end
	local pos = base + 40
	-- report adds expert info on a problem outside any AltMark option, at the top of the tree
	-- (not in an altmark tree: the filter altmark matches AltMark options only), over the
	-- captured bytes of [off, off+len).
	local function report(off, len, text)
		off = math.min(off, cap - 1)
		len = math.max(1, math.min(len, cap - off))
		tree:add_tvb_expert_info(e_malformed, tvb(off, len), text)
	end
	for _ = 1, MAX_EXT do
		local hl
		if nh == NH_HBH or nh == NH_DEST or nh == NH_ROUTING then
			if pos + 2 > cap then
				return -- the capture (or the packet) ends here; the IPv6 dissector reports a short packet
			end
			hl = (tvb(pos + 1, 1):uint() + 1) * 8
		elseif nh == NH_FRAGMENT then
			hl = 8
			if pos + 4 <= cap and tvb(pos + 2, 2):uint() >= 8 then -- fragment offset not 0
				return -- a later fragment: what follows is payload, not headers
			end
		elseif nh == NH_AH then
			if pos + 2 > cap then
				return
			end
			hl = (tvb(pos + 1, 1):uint() + 2) * 4
		else
			return -- the upper layer (or No Next Header): done
		end
		if pos + hl > limit then
			if nh == NH_HBH or nh == NH_DEST then
				report(pos, 2, string.format(
					"%s header of %d bytes at IPv6 payload byte %d overruns the IPv6 payload (%d bytes)",
					header_names[nh], hl, pos - base - 40, limit - base - 40))
				-- Still look at what lies within both header and capture: an AltMark option there
				-- is shown (and reported), not hidden.
				walk_options(tree, pinfo, tvb, nh, pos, hl, math.min(pos + hl, limit), cap, report)
			end
			return
		end
		if nh == NH_HBH or nh == NH_DEST then
			if not walk_options(tree, pinfo, tvb, nh, pos, hl, pos + hl, cap, report) then
				return
			end
		end
		if pos + 1 > cap then
			return
		end
		nh = tvb(pos, 1):uint()
		pos = pos + hl
	end
end

function altmark.dissector(tvb, pinfo, tree)
	local hdrs = { ipv6_field() }
	for _, fi in ipairs(hdrs) do
		local src = fi.source
		if src and fi.offset then
			-- An error in one header (a tvb access this code did not foresee) must not hide
			-- the others, nor become a Lua error in the tree.
			local ok, err = pcall(dissect_ipv6, src, pinfo, tree, fi.offset)
			if not ok then
				pcall(function()
					tree:add_tvb_expert_info(e_malformed, src(fi.offset, 1), "not decoded: " .. tostring(err))
				end)
			end
		end
	end
end

register_postdissector(altmark)
