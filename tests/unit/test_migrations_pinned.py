"""Applied migrations are append-only: each released file's sha256 is pinned here.

The migrator refuses to run when an applied migration's file no longer matches the
checksum it recorded (``MigrationEdited``), so an edit to a released file, even to a
comment, stops every existing database from upgrading. Found in review: a rename of
the store's modules rewrote a path in a comment of 0015. A new migration adds its line
here; a released one never changes.
"""

from __future__ import annotations

from onceflow_examples import MIGRATIONS as EXAMPLES
from workflow_engine.store import PRODUCT, available_migrations

RELEASED = {
    1: "e3398572a0fbe863172a640a2a59a9ce5d8673f63a289cfd65ad56ac749d0a90",
    2: "f3684f1ae5fdc9a797e37a63d4c0052d6091caceead11aa2a7578868bff20dc0",
    3: "97b2bf9fed7c199d8587a596867cbd7ea08a5f2dc121bac8d3b24c09aef04707",
    4: "d853988705facbf88ba44525b553b8c4d2abdea9a4591c953b8056f19a0a5771",
    5: "04c9fc665d15b66f5c0f0829c4a587f38ad9b59a644a1b4c447eba668a5a06ca",
    6: "e0ec110e32740c3701ff753e76b230bb17f37485bfd3b2780006215679f7bcbf",
    7: "545776fb9af1f2c4c60d2f3defec61afca215e89488ee334e637ee19b94db14b",
    8: "c6366f12dd2a6c29cc810b57ec6436d396e7a0d33e7ac6336ed45f87223e3ca4",
    9: "be2a59d2df2d6929d939777a1851ee580791352101acce25688c442708df85d1",
    10: "6a0b90a1c200635f5380aef5a07d1aef5bdea7acf69803f311bdef5281d270fc",
    11: "905a11fc606be0e72d538a79d866ac961fab4fbc34b2d3ee0377b0af2c668a22",
    12: "74192f11f74f7b98ebb69c233e914881a14372f00814560f6282b8d882b43f3e",
    13: "ff45eb23e0a99c010620774f4c54159e056d688f8562716808127a9fd7a1dc73",
    14: "ad3af948c45d37db569b07864175552e57ded39a4ed7fdce907baf6ff5e416c8",
    15: "9a985ce430251a002f5f2c314417a0cdb756c72547fdc8313f4673284b3e0412",
    16: "b698f70b28ee8f7f7d447bfb21b989b6cb1f6229983312836d5338827061ca79",
    17: "69b2154cb91d75d14669a87a3cb76f81f037f917e3207b51d2096f4bd57a93ca",
    18: "71fe95df56b8cefaf7ee360fe7104c53953ee2f332c52d7ecb35efd27b128699",
    19: "da11a96fa422eab16a15193ec339de399db744518c65f700e265085783bb8575",
    20: "fb25e97d6cc810da0a08691358011414d15673c6bfc6c151187024e4f3541a1f",
    21: "3feabe7fe21469f647f30378dc5dcf690ffd96fdd6864bd885cd297475c02fb1",
    22: "b38411274c4d9c66e98cb534e1446d610c2b190101d6770aec70af816e65e5c5",
    23: "2527f180231ada3047646c5e156669ce9ab63492d5eeb98f25e6652d0d4e1e33",
    24: "bbe5491c02f9efc5b94da01b53cf4463ca3f3962515c01130bcc04cca1fd71a0",
    25: "21b9390f00a5f40aafcbe012fc345533efee474f172761a5c12bc3e839ee8fb9",
    26: "c89c2f5cc7bd6a6b69701c1a8e2e0020cfd46905b8254a68bd63e631209f63a2",
    27: "a503fa24fcdc24594d413f0231a7dccfab962d9ce89e45e16826762f492c8976",
    28: "8ff5fe0e303ed93709ae83f1b1464522363defb2e7c2601b4af26e1b87508174",
    29: "b3f6caecc80c7e69b3a83748317a0fa9009e558ec2a2a319759038a941fdd8df",
    30: "4548100efd20fc2aac97a526ee4e498625c11c3631f6b2e3c7229d94f12d0198",
    31: "ed2854cbb50af0d8ed36cd3ffa7c49559495cc7a4ce72f13f37c6d76884a3e1c",
}
RELEASED_EXAMPLES = {1: "2b5d0821aaeb14ab2d52ecdd71e9d6191c5f91933cdb88afcedb5b76721d4b62"}


def test_no_released_product_migration_was_edited():
    found = {m.version: m.checksum for m in available_migrations(PRODUCT)}
    assert {v: found.get(v) for v in RELEASED} == RELEASED
    assert set(found) - set(RELEASED) == set(), "a new migration: pin its checksum here"


def test_no_released_example_migration_was_edited():
    found = {m.version: m.checksum for m in available_migrations(EXAMPLES)}
    assert {v: found.get(v) for v in RELEASED_EXAMPLES} == RELEASED_EXAMPLES
    assert set(found) - set(RELEASED_EXAMPLES) == set(), "a new migration: pin it here"
