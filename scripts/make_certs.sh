#!/usr/bin/env bash
# Makes a private certificate authority and certificates signed by it, with the openssl
# command, for troupe's TLS (SECURITY.md): what the demo, the examples and the tests use, and a
# starting point for a cluster of your own.
#
#   scripts/make_certs.sh DIR [NAME...]
#
# Writes into DIR (created with mode 0700; keys are 0600):
#   ca.pem                      the CA's certificate: TROUPE_TLS_CA for every process
#   ca.key                      its key (keep it off the cluster's machines)
#   node.pem, node.key          a certificate for servers and clients alike, valid for the
#                               names given (default: localhost and 127.0.0.1, each as a DNS
#                               name and, for addresses, as an IP address too): TROUPE_TLS_CERT
#                               and TROUPE_TLS_KEY
# and, with TROUPE_CERTS_FOR_TESTS=1, what the tests check against:
#   other-ca.pem, other.pem, other.key      a second CA and a certificate signed by it
#   expired.pem, expired.key                signed by ca.pem, valid only in 2020
#   wrong-name.pem, wrong-name.key          signed by ca.pem, for the name "elsewhere.invalid"
#
# Certificates are ECDSA P-256, valid for 30 days. Existing files in DIR are replaced.
set -euo pipefail

if [ $# -lt 1 ]; then
  echo "usage: $0 DIR [NAME...]" >&2
  exit 2
fi
dir=$1
shift
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  names=(localhost 127.0.0.1 ::1)
fi

umask 077
mkdir -p "$dir"
chmod 700 "$dir"
cd "$dir"

# subjectAltName for the names: every name as a DNS name (kj-tls, which troupe uses, checks
# DNS names only, also for a host given as an address) and every address as an IP address.
san() {
  local out="" n
  for n in "$@"; do
    out+="${out:+,}DNS:$n"
    if [[ $n =~ ^[0-9.]+$ || $n == *:* ]]; then out+=",IP:$n"; fi
  done
  echo "$out"
}

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

new_ca() {  # new_ca NAME SUBJECT
  key "$1.key"
  openssl req -x509 -new -key "$1.key" -sha256 -days 30 -subj "/CN=$2" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
    -out "$1.pem" 2>/dev/null
}

# sign CA NAME SUBJECT SAN [STARTDATE ENDDATE]: NAME.pem signed by CA, for SAN.
sign() {
  local ca=$1 name=$2 subject=$3 alt=$4
  key "$name.key"
  openssl req -new -key "$name.key" -subj "/CN=$subject" -out "$name.csr" 2>/dev/null
  cat >"$name.ext" <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$alt
EOF
  if [ $# -ge 6 ]; then
    # `openssl x509` cannot date a certificate in the past; `openssl ca` can.
    local db=$name.db
    mkdir -p "$db"
    : >"$db/index.txt"
    cat >"$db/ca.cnf" <<EOF
[ca]
default_ca = local
[local]
database = $db/index.txt
new_certs_dir = $db
serial = $db/serial
default_md = sha256
policy = any
copy_extensions = none
[any]
commonName = supplied
EOF
    echo 01 >"$db/serial"
    openssl ca -batch -config "$db/ca.cnf" -cert "$ca.pem" -keyfile "$ca.key" \
      -startdate "$5" -enddate "$6" -extfile "$name.ext" -in "$name.csr" -out "$name.pem" \
      -notext 2>/dev/null
    rm -rf "$db"
  else
    openssl x509 -req -in "$name.csr" -CA "$ca.pem" -CAkey "$ca.key" -CAcreateserial \
      -sha256 -days 30 -extfile "$name.ext" -out "$name.pem" 2>/dev/null
  fi
  rm -f "$name.csr" "$name.ext" "$ca.srl"
}

new_ca ca "troupe local CA"
sign ca node "troupe node" "$(san "${names[@]}")"

if [ "${TROUPE_CERTS_FOR_TESTS:-0}" = 1 ]; then
  new_ca other-ca "another CA"
  sign other-ca other "troupe node" "$(san "${names[@]}")"
  sign ca expired "troupe node" "$(san "${names[@]}")" 20200101000000Z 20200102000000Z
  sign ca wrong-name "elsewhere" "DNS:elsewhere.invalid"
fi
chmod 600 ./*.key
