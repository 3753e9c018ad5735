#!/usr/bin/perl
# 16-bit activations' tiles (two tokens or more): every instruction set's
# bits against the scalar reference, tile widths 1-40, ragged tiles, row
# groups and ranges, both weight layouts, extreme blocks and codes (C unit
# test under ASan/UBSan).
exec './build/t/test_quant_x16_tiles'
    or die "cannot run build/t/test_quant_x16_tiles: $!";
