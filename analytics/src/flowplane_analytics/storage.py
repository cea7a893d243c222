"""Where a dataset lives: a local directory or an S3-compatible object store.

A dataset is named by a path (``/data/am``, ``file:///data/am``) or a URL ``s3://BUCKET/PREFIX``
(``s3a://`` is the same place: the name Spark's Hadoop uses). The store is reached with the
standard AWS settings from the environment: ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` (an
S3-compatible server, e.g. ``http://127.0.0.1:9000``; unset: AWS itself), ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN`` and ``AWS_REGION`` (or ``AWS_DEFAULT_REGION``;
default us-east-1). Objects are addressed path-style (``ENDPOINT/BUCKET/KEY``), which every
S3-compatible server accepts.

One mechanism per engine, both from here: `collect` writes through pyarrow's S3 filesystem
(an object appears whole when its upload completes, or not at all, so no temporary name is
needed), DuckDB reads through the same filesystem registered with it (fsspec), and Spark
through Hadoop's S3A with the jars of ``analytics/jars/pom.xml`` (`spark_jars`).
"""

from __future__ import annotations

import glob
import os
import tempfile
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

SCHEMES = ("s3", "s3a")
JARS_ENV = "FLOWPLANE_SPARK_JARS"
# A checkout's jars, fetched by `make setup` (analytics/.jars next to src/).
_CHECKOUT_JARS = Path(__file__).resolve().parents[2] / ".jars"


class StorageError(Exception):
    """A dataset URL or store setting that cannot work: bad input, said in one line."""


def scheme(url: str) -> str:
    """ "" for a local path (file:// included), else the URL's scheme."""
    if "://" not in url or url.startswith("file://"):
        return ""
    return url.split("://", 1)[0].lower()


def is_local(url: str) -> bool:
    return scheme(str(url)) == ""


def is_s3(url: str) -> bool:
    return scheme(str(url)) in SCHEMES


def local_path(url: str | Path) -> Path:
    return Path(str(url).removeprefix("file://"))


def split(url: str) -> tuple[str, str]:
    """(bucket, key prefix without slashes at its ends) of an s3:// URL."""
    u = urllib.parse.urlsplit(url)
    if u.scheme.lower() not in SCHEMES or not u.netloc:
        raise StorageError(f"{url}: want s3://BUCKET/PREFIX")
    return u.netloc, u.path.strip("/")


# The scheme DuckDB reaches the store by: pyarrow's S3 filesystem registered under a name of
# its own (a path starting s3:// would make Ibis load DuckDB's httpfs extension instead).
DUCKDB_SCHEME = "fps3"


def for_engine(url: str, engine: str) -> str:
    """The dataset URL as the engine names it: s3a:// for Spark's Hadoop, fps3:// for DuckDB
    (duckdb_register)."""
    if not is_s3(url):
        return url
    bucket, key = split(url)
    return f"{'s3a' if engine == 'spark' else DUCKDB_SCHEME}://{bucket}/{key}".rstrip("/")


@dataclass(frozen=True)
class S3Settings:
    endpoint: str | None  # scheme://host:port, or None for AWS
    access_key: str | None
    secret_key: str | None
    session_token: str | None
    region: str

    @classmethod
    def from_env(cls) -> S3Settings:
        env = os.environ
        ep = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
        if ep:
            u = urllib.parse.urlsplit(ep)
            if u.scheme not in ("http", "https") or not u.netloc:
                raise StorageError(
                    f"AWS_ENDPOINT_URL{'_S3' if env.get('AWS_ENDPOINT_URL_S3') else ''}={ep}: "
                    "want http://HOST:PORT or https://HOST:PORT"
                )
        return cls(
            endpoint=ep.rstrip("/") if ep else None,
            access_key=env.get("AWS_ACCESS_KEY_ID") or None,
            secret_key=env.get("AWS_SECRET_ACCESS_KEY") or None,
            session_token=env.get("AWS_SESSION_TOKEN") or None,
            region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
        )


@cache
def _arrow_s3(settings: S3Settings) -> Any:
    import pyarrow.fs as pafs

    kw: dict[str, Any] = {"region": settings.region, "force_virtual_addressing": False}
    if settings.endpoint:
        u = urllib.parse.urlsplit(settings.endpoint)
        kw.update(endpoint_override=u.netloc, scheme=u.scheme)
    if settings.access_key and settings.secret_key:
        kw.update(
            access_key=settings.access_key,
            secret_key=settings.secret_key,
            session_token=settings.session_token,
        )
    return pafs.S3FileSystem(**kw)


def arrow_s3() -> Any:
    """pyarrow's S3 filesystem for the environment's settings (one per distinct settings)."""
    return _arrow_s3(S3Settings.from_env())


# Writing ---------------------------------------------------------------------------------


class Root:
    """A dataset root to write and list: a local directory (each file written to a temporary
    name, synced and renamed into place) or an S3 prefix (each object uploaded whole: it
    appears when its upload completes, or not at all, so a reader never sees a part of it)."""

    def __init__(self, url: str | Path) -> None:
        self.url = str(url).rstrip("/") or "/"
        if is_local(self.url):
            self.path: Path | None = local_path(self.url)
            self._bucket = self._key = ""
        elif is_s3(self.url):
            self.path = None
            self._bucket, self._key = split(self.url)
        else:
            raise StorageError(f"{url}: want a local directory or s3://BUCKET/PREFIX")

    def _obj(self, rel: str) -> str:
        return "/".join(x for x in (self._bucket, self._key, rel) if x)

    def __str__(self) -> str:
        return self.url

    def make(self) -> None:
        """Creates the root (a directory, or checks the bucket answers)."""
        if self.path is not None:
            self.path.mkdir(parents=True, exist_ok=True)
            return
        import pyarrow.fs as pafs

        info = arrow_s3().get_file_info(self._bucket)
        if info.type == pafs.FileType.NotFound:
            raise StorageError(f"{self.url}: no bucket {self._bucket!r} (create it first)")

    def write(self, rel: str, writer: Callable[[Any], None], sync: bool = True) -> None:
        """Writes rel (a /-separated path under the root) with writer(binary file). sync False:
        no fsync of a local file (synthetic data, where a crash loses nothing worth keeping)."""
        if self.path is None:
            with arrow_s3().open_output_stream(self._obj(rel)) as f:
                writer(f)
            return
        path = self.path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                writer(f)
                f.flush()
                if sync:
                    os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def exists(self, rel: str) -> bool:
        if self.path is not None:
            return (self.path / rel).exists()
        import pyarrow.fs as pafs

        return arrow_s3().get_file_info(self._obj(rel)).type == pafs.FileType.File

    def files(self, rel: str) -> list[str]:
        """Every file under rel (recursively), as /-separated paths relative to rel."""
        if self.path is not None:
            base = self.path / rel
            if not base.is_dir():
                return []
            return [str(p.relative_to(base)) for p in base.rglob("*") if p.is_file()]
        import pyarrow.fs as pafs

        prefix = self._obj(rel)
        sel = pafs.FileSelector(prefix, recursive=True, allow_not_found=True)
        return [
            i.path[len(prefix) + 1 :]
            for i in arrow_s3().get_file_info(sel)
            if i.type == pafs.FileType.File
        ]

    def dirs(self, rel: str) -> list[str]:
        """The names of the directories directly under rel (S3: the common prefixes)."""
        if self.path is not None:
            base = self.path / rel
            return [d.name for d in base.iterdir() if d.is_dir()] if base.is_dir() else []
        import pyarrow.fs as pafs

        sel = pafs.FileSelector(self._obj(rel), recursive=False, allow_not_found=True)
        return [
            i.base_name for i in arrow_s3().get_file_info(sel) if i.type == pafs.FileType.Directory
        ]

    def remove_stale_temporaries(self) -> int:
        """Deletes the temporary files a killed writer left (local only: an S3 upload that
        did not complete leaves no object)."""
        if self.path is None or not self.path.is_dir():
            return 0
        n = 0
        for p in self.path.rglob(".*.tmp"):
            p.unlink(missing_ok=True)
            n += 1
        return n


# DuckDB ------------------------------------------------------------------------------------


def duckdb_register(raw: Any) -> None:
    """Lets a DuckDB connection read the store as fps3://BUCKET/KEY: pyarrow's S3 filesystem,
    registered through fsspec. (DuckDB's own httpfs extension is not used: DuckDB downloads
    it from its extension repository at run time, which is not always reachable, and the
    Python packages that ship it stop at DuckDB 1.5, while the analytics run DuckDB 2.)"""
    from fsspec.implementations.arrow import ArrowFSWrapper

    prefix = DUCKDB_SCHEME + "://"

    class _S3(ArrowFSWrapper):  # type: ignore[misc]
        protocol = (DUCKDB_SCHEME,)

        @classmethod
        def _strip_protocol(cls, path: Any) -> Any:
            if isinstance(path, list):
                return [cls._strip_protocol(p) for p in path]
            return str(path).removeprefix(prefix).rstrip("/")

    if not raw.filesystem_is_registered(DUCKDB_SCHEME):
        raw.register_filesystem(_S3(arrow_s3()))


# Spark -------------------------------------------------------------------------------------


def spark_jars() -> list[str]:
    """The jars S3A needs (hadoop-aws matching pyspark's Hadoop, the AWS SDK modules):
    $FLOWPLANE_SPARK_JARS (a directory of jars, or a comma-separated list), else a checkout's
    analytics/.jars that `make setup` fills; [] when neither has any."""
    spec = os.environ.get(JARS_ENV, "")
    if spec:
        if os.path.isdir(spec):
            return sorted(glob.glob(os.path.join(spec, "*.jar")))
        return [j for j in spec.split(",") if j]
    return sorted(glob.glob(str(_CHECKOUT_JARS / "*.jar")))


def spark_s3_conf(settings: S3Settings | None = None) -> dict[str, str]:
    """Hadoop S3A settings (without the spark.hadoop. prefix) for the environment's store."""
    s = settings or S3Settings.from_env()
    conf = {
        "fs.s3a.path.style.access": "true",
        "fs.s3a.endpoint.region": s.region,
    }
    if s.endpoint:
        u = urllib.parse.urlsplit(s.endpoint)
        conf["fs.s3a.endpoint"] = s.endpoint
        conf["fs.s3a.connection.ssl.enabled"] = str(u.scheme == "https").lower()
    if s.access_key and s.secret_key:
        conf["fs.s3a.access.key"] = s.access_key
        conf["fs.s3a.secret.key"] = s.secret_key
        provider = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
        if s.session_token:
            conf["fs.s3a.session.token"] = s.session_token
            provider = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
        conf["fs.s3a.aws.credentials.provider"] = provider
    return conf


def spark_register(session: Any) -> None:
    """Sets the S3A settings on a running session's Hadoop configuration (the store's
    filesystem is made at its first use, with them); StorageError when S3A's jars are not on
    the session's classpath."""
    jvm = session.sparkContext._jvm
    try:
        jvm.java.lang.Class.forName(
            "org.apache.hadoop.fs.s3a.S3AFileSystem",
            True,
            jvm.Thread.currentThread().getContextClassLoader(),
        )
    except Exception as e:
        raise StorageError(
            "--engine spark cannot read s3:// without hadoop-aws and the AWS SDK: run `make "
            f"setup` (fills analytics/.jars), or set {JARS_ENV} to a directory holding "
            "hadoop-aws-3.4.1.jar and the AWS SDK v2 jars (analytics/jars/pom.xml lists them)"
        ) from e
    hc = session.sparkContext._jsc.hadoopConfiguration()
    for k, v in spark_s3_conf().items():
        hc.set(k, v)
