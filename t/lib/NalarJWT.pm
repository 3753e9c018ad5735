package NalarJWT;

# JSON Web Tokens for the module tests, made the way a real issuer makes
# them: HS256 with core Perl's HMAC, RS256 with the openssl command.
#
#   my $jwt = NalarJWT::hs256($secret, { sub => 'alice', exp => time + 60 });
#   my $jwt = NalarJWT::rs256("$dir/rsa.pem", { sub => 'bob' });
#   my $jwt = NalarJWT::token({ alg => 'none' }, { sub => 'x' }, '');

use strict;
use warnings;

use Digest::SHA qw(hmac_sha256);
use File::Temp qw(tempfile);
use JSON::PP;
use MIME::Base64 qw(encode_base64url);

my $JSON = JSON::PP->new->utf8->canonical;

sub b64 { encode_base64url($_[0]) }
sub json_encode { $JSON->encode($_[0]) }

# "header.payload" of the compact serialization
sub signing_input {
    my ($header, $claims) = @_;
    return b64($JSON->encode($header)) . '.' . b64($JSON->encode($claims));
}

# A token with the given raw signature bytes.
sub token {
    my ($header, $claims, $sig) = @_;
    return signing_input($header, $claims) . '.' . b64($sig);
}

sub hs256 {
    my ($secret, $claims, %header) = @_;
    my $in = signing_input({ alg => 'HS256', typ => 'JWT', %header }, $claims);
    return "$in." . b64(hmac_sha256($in, $secret));
}

# RS256 with a PEM private key, signed by `openssl dgst`.
sub rs256 {
    my ($key, $claims, %header) = @_;
    my $in = signing_input({ alg => 'RS256', typ => 'JWT', %header }, $claims);
    my ($fh, $file) = tempfile(UNLINK => 1);
    print $fh $in;
    close $fh;
    open my $sig, '-|', 'openssl', 'dgst', '-sha256', '-sign', $key,
        '-binary', $file or die "openssl: $!";
    binmode $sig;
    local $/;
    my $s = <$sig>;
    close $sig or die "openssl dgst -sign failed";
    return "$in." . b64($s);
}

1;
