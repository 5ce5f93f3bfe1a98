"""Value sets for demos, benchmarks and tests: bundled real label sets and the
paper's synthetic tool names (appendix C.2).

Examples
--------
>>> from triemask.datasets import load_labels, synthetic_tools
>>> len(load_labels("banking77")), synthetic_tools(3, seed=1)
(77, ['stripe.fetch_payment', 'github.update_repository', 'microsoft.update_file'])
"""

from __future__ import annotations

import gzip
import json
import random
from importlib import resources

__all__ = [
    "LABEL_SETS",
    "load_icd10cm",
    "load_icd10cm_descriptions",
    "load_labels",
    "load_test_set",
    "load_tool_registry",
    "synthetic_products",
    "synthetic_tools",
    "tool_catalogue",
    "tool_specs",
]

LABEL_SETS = ("trec", "massive", "banking77", "clinc150")

# The paper's pools: 10 namespaces x 10 actions x 10 resources, 70% namespaced.
_NAMESPACES = ["slack", "github", "stripe", "aws", "google", "microsoft", "salesforce", "jira", "notion", "discord"]
_ACTIONS = ["get", "create", "update", "delete", "list", "search", "send", "fetch", "upload", "download"]
_RESOURCES = ["user", "message", "file", "project", "issue", "payment", "invoice", "document", "channel", "repository"]
# Extensions, used in this order once the paper's 1,100 names are not enough.
_MORE_NAMESPACES = [
    "zendesk",
    "hubspot",
    "shopify",
    "twilio",
    "dropbox",
    "asana",
    "trello",
    "gitlab",
    "bitbucket",
    "azure",
    "gcp",
    "okta",
    "auth0",
    "datadog",
    "pagerduty",
    "sentry",
    "figma",
    "linear",
    "airtable",
    "mailchimp",
    "sendgrid",
    "intercom",
    "freshdesk",
    "monday",
    "clickup",
    "box",
    "zoom",
    "webex",
    "teams",
    "outlook",
    "gmail",
    "calendar",
    "drive",
    "sheets",
    "docs",
    "bigquery",
    "snowflake",
    "redshift",
    "postgres",
    "mysql",
    "mongodb",
    "redis",
    "elastic",
    "kafka",
    "rabbitmq",
    "s3",
    "ec2",
    "lambda",
    "dynamodb",
    "cloudwatch",
    "iam",
    "kubernetes",
    "docker",
    "terraform",
    "ansible",
    "jenkins",
    "circleci",
    "vercel",
    "netlify",
    "heroku",
    "cloudflare",
    "fastly",
    "akamai",
    "paypal",
    "square",
    "plaid",
    "braintree",
    "adyen",
    "quickbooks",
    "xero",
    "netsuite",
    "workday",
    "bamboohr",
    "greenhouse",
    "lever",
    "gusto",
    "docusign",
    "hellosign",
    "pandadoc",
    "confluence",
    "miro",
    "canva",
    "spotify",
    "youtube",
    "twitter",
    "linkedin",
    "facebook",
    "instagram",
    "tiktok",
    "reddit",
    "telegram",
    "whatsapp",
    "signal",
    "openai",
    "anthropic",
    "huggingface",
    "pinecone",
    "weaviate",
    "supabase",
    "firebase",
    "segment",
    "amplitude",
    "mixpanel",
    "tableau",
    "looker",
]
_MORE_ACTIONS = [
    "archive",
    "restore",
    "approve",
    "reject",
    "assign",
    "unassign",
    "share",
    "export",
    "import",
    "sync",
    "merge",
    "close",
    "open",
    "lock",
    "unlock",
    "publish",
    "schedule",
    "cancel",
    "retry",
    "validate",
]
_MORE_RESOURCES = [
    "team",
    "workspace",
    "comment",
    "attachment",
    "label",
    "milestone",
    "release",
    "branch",
    "commit",
    "pipeline",
    "deployment",
    "ticket",
    "customer",
    "order",
    "subscription",
    "refund",
    "product",
    "price",
    "coupon",
    "report",
    "dashboard",
    "alert",
    "incident",
    "metric",
    "log",
    "event",
    "webhook",
    "token",
    "key",
    "secret",
    "role",
    "permission",
    "group",
    "folder",
    "calendar",
    "meeting",
    "contact",
    "lead",
    "opportunity",
    "account",
    "campaign",
    "task",
    "note",
    "page",
    "database",
    "table",
    "record",
    "bucket",
    "instance",
    "cluster",
]
_QUALIFIERS = [
    "_by_id",
    "_by_name",
    "_batch",
    "_v2",
    "_async",
    "_details",
    "_history",
    "_status",
    "_settings",
    # beyond about 2.1 million names (the large-set benchmarks: up to 5 million)
    "_v3",
    "_bulk",
    "_count",
    "_export",
    "_import",
    "_preview",
    "_summary",
    "_metadata",
    "_permissions",
    "_schema",
    "_stream",
    "_sync",
    "_legacy",
    "_internal",
    "_admin",
    "_raw",
]


def _tool_space(k: int) -> list[str]:
    """The smallest catalogue of tool names holding at least ``k`` names.

    Up to 1,100 names this is exactly the paper's space. Beyond, the pools grow
    one entry at a time, namespaces, actions and resources in turn (then a
    qualifier suffix such as ``_by_id``), until the space holds ``k`` names, so
    that a sample stays dense and keeps the paper's heavy prefix sharing.
    """
    namespaces, actions, resources, qualifiers = list(_NAMESPACES), list(_ACTIONS), list(_RESOURCES), [""]
    pools = [(namespaces, _MORE_NAMESPACES), (actions, _MORE_ACTIONS), (resources, _MORE_RESOURCES)]

    def size() -> int:
        return (len(namespaces) + 1) * len(actions) * len(resources) * len(qualifiers)

    turn = 0
    while size() < k:
        pool, extra = pools[turn % 3]
        turn += 1
        if len(pool) - 10 < len(extra):
            pool.append(extra[len(pool) - 10])
        elif all(len(p) - 10 >= len(x) for p, x in pools):
            if len(qualifiers) > len(_QUALIFIERS):
                raise ValueError(f"cannot generate {k} distinct tool names (at most {size()})")
            qualifiers.append(_QUALIFIERS[len(qualifiers) - 1])
    return [f"{n}.{a}_{r}{q}" for q in qualifiers for n in namespaces for a in actions for r in resources] + [
        f"{a}_{r}{q}" for q in qualifiers for a in actions for r in resources
    ]


def synthetic_tools(k: int, seed: int = 0) -> list[str]:
    """``k`` distinct synthetic tool names such as ``slack.get_user`` (paper, appendix C.2).

    Names are ``<namespace>.<action>_<resource>`` or ``<action>_<resource>``, drawn
    uniformly from the smallest catalogue that holds ``k`` names (see
    ``_tool_space``): for ``k <= 1,100`` the paper's pools, beyond that pools
    extended with real service names, more actions and resources, and finally
    qualifier suffixes (up to about 5.4 million names).
    """
    return random.Random(seed).sample(_tool_space(k), k)


# Product names (paper, appendix C.2): category > brand > adjective and model number > colour.
_CATEGORIES = {
    "Electronics": ["Sony", "Samsung", "Apple", "LG", "Bose", "Philips"],
    "Home & Kitchen": ["KitchenAid", "Dyson", "Ninja", "Cuisinart", "Breville", "OXO"],
    "Sports": ["Nike", "Adidas", "Puma", "Wilson", "Yeti", "Garmin"],
    "Toys": ["Lego", "Mattel", "Hasbro", "Bandai", "Ravensburger", "Melissa & Doug"],
    "Books": ["Penguin", "HarperCollins", "Vintage", "Tor", "Scholastic", "O'Reilly"],
    "Beauty": ["L'Oréal", "Nivea", "Clinique", "Dove", "Olay", "Neutrogena"],
}
_ADJECTIVES = ["Premium", "Classic", "Pro", "Ultra", "Compact", "Deluxe", "Essential", "Smart"]
_COLOURS = ["Black", "White", "Silver", "Red", "Blue", "Green", "Graphite", "Rose Gold"]


def synthetic_products(k: int = 1_500, seed: int = 0) -> list[str]:
    """``k`` distinct synthetic product names such as ``Electronics > Sony > Premium 4823 > Black``.

    Category x brand x adjective x four-digit model number x colour (paper, appendix C.2):
    natural-language-like values whose category and brand prefixes are shared.
    """
    if not 0 <= k <= 100_000:
        raise ValueError(f"k must lie in [0, 100000], got {k}")
    rng = random.Random(seed)
    names: dict[str, None] = {}  # insertion-ordered, so the result does not depend on string hashing
    catalogue = [(category, brand) for category, brands in _CATEGORIES.items() for brand in brands]
    while len(names) < k:
        category, brand = rng.choice(catalogue)
        model = f"{rng.choice(_ADJECTIVES)} {rng.randrange(1000, 10000)}"
        names[f"{category} > {brand} > {model} > {rng.choice(_COLOURS)}"] = None
    return list(names)


def _read(name: str) -> bytes:
    return resources.files("triemask").joinpath("data").joinpath(name).read_bytes()


def load_labels(name: str) -> list[str]:
    """A bundled classification label set: ``trec`` (42), ``massive`` (60),
    ``banking77`` (77) or ``clinc150`` (150)."""
    if name not in LABEL_SETS:
        raise ValueError(f"unknown label set {name!r}; choose one of {', '.join(LABEL_SETS)}")
    return _read(f"{name}_labels.txt").decode("utf-8").split()


def load_icd10cm() -> list[str]:
    """The 74,719 billable ICD-10-CM FY2026 codes, dotted (``E11.9``), in CMS order."""
    return list(load_icd10cm_descriptions())


def load_icd10cm_descriptions() -> dict[str, str]:
    """Each billable ICD-10-CM FY2026 code (CMS order) with its description."""
    lines = gzip.decompress(_read("icd10cm_codes_desc.tsv.gz")).decode("utf-8").splitlines()
    return dict(line.split("\t", 1) for line in lines)


def load_tool_registry() -> list[str]:
    """The demo's registry of 10,000 tool names (``synthetic_tools(10_000, seed=0)``, shipped as data)."""
    return gzip.decompress(_read("tool_registry_10k.txt.gz")).decode("ascii").split()


_UNITS = ["metric", "imperial", "kelvin"]
_PRIORITIES = ["low", "normal", "high", "urgent"]
_FORMATS = ["json", "csv", "markdown", "html", "pdf", "xml", "yaml", "txt"]
_REGIONS = [
    f"{area}-{side}-{n}"
    for area in ("us", "eu", "ap", "sa", "me", "af")
    for side in ("east", "west", "central")
    for n in (1, 2)
]


def tool_specs(names: list[str]) -> list[dict[str, object]]:
    """OpenAI-style function specs for tool ``names``, with small argument schemas.

    Each tool's ``parameters`` follow from its action and resource (``get_user``:
    an id; ``search_*``: a query, a limit and an output format; ``send_*``: a
    recipient, a text and a priority; ...), so tools share parameter schemas the way
    real registries do; several have enum fields (priority, format, region, units).
    """
    specs: list[dict[str, object]] = []
    for name in names:
        action, _, resource = name.rsplit(".", 1)[-1].partition("_")
        resource = resource.split("_v")[0]
        properties: dict[str, object] = {f"{resource}_id": {"type": "string"}}
        required = [f"{resource}_id"]
        if action in ("search", "list"):
            properties = {
                "query": {"type": "string"},
                "limit": {"type": "integer"},
                "format": {"enum": _FORMATS},
            }
            required = ["query"]
        elif action in ("send", "create"):
            properties = {"text": {"type": "string"}, "priority": {"enum": _PRIORITIES}, "region": {"enum": _REGIONS}}
            required = ["text", "priority"]
        elif action in ("update", "upload"):
            properties[f"{resource}_id"] = {"type": "string"}
            properties["fields"] = {
                "type": "object",
                "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
            }
        elif action == "fetch":
            properties["units"] = {"enum": _UNITS}
        specs.append(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": f"{action.capitalize()} a {resource.replace('_', ' ')}",
                    "parameters": {"type": "object", "properties": properties, "required": required},
                },
            }
        )
    return specs


def load_test_set(name: str) -> list[dict[str, str]]:
    """The test split of a bundled classification benchmark: rows with ``text`` and ``label``.

    ``trec`` (500 questions), ``massive`` (2,974 utterances, en-US), ``banking77``
    (3,080) or ``clinc150`` (4,500 in-scope queries); every label is in ``load_labels(name)``.
    """
    if name not in LABEL_SETS:
        raise ValueError(f"unknown test set {name!r}; choose one of {', '.join(LABEL_SETS)}")
    lines = gzip.decompress(_read(f"{name}_test.jsonl.gz")).decode("utf-8").splitlines()
    return [{"text": row["text"], "label": row["label"]} for row in map(json.loads, lines)]


def tool_catalogue(k: int) -> tuple[list[str], list[str], list[str], list[str]]:
    """A complete registry of exactly ``k`` names (a multiple of 100, 200 to 10,000):
    the paper's 10 actions x 10 resources, un-namespaced and under ``k / 100 - 1``
    namespaces (the paper's ten first). Returns (names, namespaces, actions, resources)."""
    if k % 100 or not 200 <= k <= 10_000:
        raise ValueError(f"k must be a multiple of 100 in [200, 10000], got {k}")
    namespaces = [*_NAMESPACES, *_MORE_NAMESPACES][: k // 100 - 1]
    names = [f"{n}.{a}_{r}" for n in namespaces for a in _ACTIONS for r in _RESOURCES]
    names += [f"{a}_{r}" for a in _ACTIONS for r in _RESOURCES]
    return names, namespaces, list(_ACTIONS), list(_RESOURCES)
