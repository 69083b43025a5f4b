// Executor secrets: random, hashed, and parsed from metadata strictly.
#include "src/rpc/executor_credential.h"

#include <catch2/catch.hpp>
#include <set>

#include "absl/strings/escaping.h"

namespace dynapipe::rpc {
namespace {

using Catch::Matchers::Contains;

TEST_CASE("Secrets are 256 random bits, hex, never repeated") {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    auto s = NewExecutorSecret();
    REQUIRE(s.ok());
    CHECK(s->size() == 64);
    CHECK(s->find_first_not_of("0123456789abcdef") == std::string::npos);
    seen.insert(*s);
  }
  CHECK(seen.size() == 1000);
  auto id = RandomHex(16);
  REQUIRE(id.ok());
  CHECK(id->size() == 16);
  CHECK(*id != *RandomHex(16));
  CHECK_FALSE(RandomHex(17).ok());
}

TEST_CASE("A secret matches only its own SHA-256") {
  const std::string secret = *NewExecutorSecret();
  const std::string hash = HashExecutorSecret(secret);
  // The SHA-256 of "abc" (FIPS 180-2, appendix B.1): the hash is the standard one.
  CHECK(absl::BytesToHexString(HashExecutorSecret("abc")) ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(hash.size() == 32);
  CHECK(ExecutorSecretMatches(secret, hash));
  CHECK_FALSE(ExecutorSecretMatches(*NewExecutorSecret(), hash));
  CHECK_FALSE(ExecutorSecretMatches(secret, ""));  // a record without a credential matches nothing
  CHECK_FALSE(ExecutorSecretMatches(secret, hash.substr(0, 31)));
  CHECK_FALSE(ExecutorSecretMatches(hash, hash));  // the stored hash is not a credential
}

TEST_CASE("Credentials round-trip through metadata; malformed ones are refused naming the problem") {
  const ExecutorCredential c{"exec-node:a-0-0123456789abcdef", *NewExecutorSecret()};
  auto parsed = ParseExecutorCredential(FormatExecutorCredential(c));
  REQUIRE(parsed.ok());
  CHECK(parsed->executor_id == c.executor_id);  // a ':' in the id is fine: the secret follows the last one
  CHECK(parsed->secret == c.secret);
  for (const std::string& bad : {std::string("no-colon"), ":" + c.secret, "exec-1:" + c.secret.substr(1),
                                "exec-1:" + c.secret.substr(2) + "zz", std::string("exec-1:")}) {
    INFO(bad);
    auto r = ParseExecutorCredential(bad);
    CHECK(r.status().code() == absl::StatusCode::kUnauthenticated);
    CHECK_THAT(std::string(r.status().message()), Contains("x-dynapipe-executor"));
  }
}

}  // namespace
}  // namespace dynapipe::rpc
